"""The gRPC protocol adaserve serves: Triton's `grpc_service.proto` (the Open Inference Protocol with Triton's
extensions) and `model_config.proto`, vendored here with their licence (NOTICE), and the modules generated from
them by `make protos`. The server imports its protocol from here, so it needs no client library.
"""
