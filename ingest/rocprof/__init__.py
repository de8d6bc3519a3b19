"""rocprofv3 (ROCprofiler-SDK) JSON traces: reader.py."""
