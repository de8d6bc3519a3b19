-- Ascend PyTorch profiler database export (ascend_pytorch_profiler_{rank}.db, META_DATA SCHEMA_VERSION 1.0.0): the
-- tables the synthesizer writes, as the real export in ../shared/traces/ascend/torch_npu_2rank_level1_db declares them.

CREATE TABLE STRING_IDS (id INTEGER PRIMARY KEY,value TEXT);
CREATE TABLE TASK (startNs INTEGER,endNs INTEGER,deviceId INTEGER,connectionId INTEGER,globalTaskId INTEGER,globalPid INTEGER,taskType INTEGER,contextId INTEGER,streamId INTEGER,taskId INTEGER,modelId INTEGER, depth integer);
CREATE TABLE COMPUTE_TASK_INFO (name INTEGER,globalTaskId INTEGER PRIMARY KEY,blockDim INTEGER,mixBlockDim INTEGER,taskType INTEGER,opType INTEGER,inputFormats INTEGER,inputDataTypes INTEGER,inputShapes INTEGER,outputFormats INTEGER,outputDataTypes INTEGER,outputShapes INTEGER,attrInfo INTEGER, waitNs INTEGER);
CREATE TABLE COMMUNICATION_OP (opName INTEGER,startNs INTEGER,endNs INTEGER,connectionId INTEGER,groupName INTEGER,opId INTEGER PRIMARY KEY,relay INTEGER,retry INTEGER,dataType INTEGER,algType INTEGER,count NUMERIC,opType INTEGER, waitNs INTEGER);
CREATE TABLE META_DATA (name TEXT,value TEXT);
CREATE TABLE STEP_TIME (id INTEGER, startNs INTEGER, endNs INTEGER);
CREATE TABLE RANK_DEVICE_MAP (rankId INTEGER, deviceId INTEGER);
CREATE TABLE HOST_INFO (hostUid TEXT,hostName TEXT);
CREATE TABLE ENUM_HCCL_DATA_TYPE (id INTEGER PRIMARY KEY,name TEXT);
