"""HyScale's Python client: the coordinator's JobService (and the workers' list) over gRPC.

    import hyscale
    with hyscale.Client("127.0.0.1:50051", token_file="token") as client:
        job = client.submit(hyscale.load_spec("job.yaml"), device="gpu")
        for event in client.watch(job.id):
            print(hyscale.describe(event))

The messages are the protobuf classes of proto/hyscale/v1 (hyscale.v1.service_pb2, job_pb2),
generated into the build's python/ folder, which is the one to put on PYTHONPATH.
"""
from hyscale.client import Client, HyScaleError, describe, load_spec, TERMINAL_STATES

__all__ = ["Client", "HyScaleError", "describe", "load_spec", "TERMINAL_STATES"]
