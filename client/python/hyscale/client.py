"""The client class, its errors and the spec loader (see the package's docstring)."""
import os
import pathlib
import time

import grpc
import yaml
from google.protobuf import json_format

from hyscale.v1 import job_pb2, service_pb2, service_pb2_grpc

TERMINAL_STATES = frozenset({
    service_pb2.JOB_STATE_SUCCEEDED,
    service_pb2.JOB_STATE_FAILED,
    service_pb2.JOB_STATE_CANCELLED,
})

# Codes after which a watch reopens its stream: the coordinator restarting or out of reach.
_TRANSIENT = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED,
                        grpc.StatusCode.DEADLINE_EXCEEDED})

_DEVICE_KINDS = {
    "any": service_pb2.DEVICE_KIND_UNSPECIFIED,
    "cpu": service_pb2.DEVICE_KIND_CPU,
    "gpu": service_pb2.DEVICE_KIND_GPU,
}


class HyScaleError(Exception):
    """A call the coordinator refused or could not answer: `code` is the gRPC status code's name
    (INVALID_ARGUMENT, NOT_FOUND, UNAUTHENTICATED, UNAVAILABLE, ...), the message the server's,
    which names the field at fault for bad input."""

    def __init__(self, code, message):
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


def load_spec(source):
    """A JobSpec from a YAML or JSON file (a path) or text, in the job files' format (field names
    as in proto/hyscale/v1/job.proto, enums by name). Unknown fields are errors naming them."""
    text = source
    one_line = isinstance(source, str) and "\n" not in source
    if isinstance(source, pathlib.Path) or (one_line and (
            os.path.exists(source) or source.endswith((".yaml", ".yml", ".json")))):
        text = pathlib.Path(source).read_text()  # a missing file raises, naming it
    data = yaml.safe_load(text)
    if not isinstance(data, dict):
        raise ValueError("spec: must be a mapping of the JobSpec's fields")
    try:
        return json_format.ParseDict(data, job_pb2.JobSpec())
    except json_format.ParseError as error:
        raise ValueError(f"spec: {error}") from None


def describe(event):
    """One line for a JobEvent, as `hyscale watch` prints the kinds it knows."""
    kind = event.WhichOneof("kind")
    if kind == "state_change":
        change = event.state_change
        line = f"state {service_pb2.JobState.Name(change.to)}"
        return f"{line}: {change.reason}" if change.reason else line
    if kind == "replanned":
        return f"re-planned: {event.replanned.reason}"
    if kind == "trainer":
        line = event.trainer.event
        return f"rank {event.trainer.rank} {line.WhichOneof('kind') or 'event'}"
    return f"event {event.sequence}"


class Client:
    """A connection to hyscaled. `server` host:port (else $HYSCALE_SERVER, else 127.0.0.1:50051);
    the bearer token from `token`, else `token_file`, else $HYSCALE_TOKEN; `tls_ca` (PEM file) for
    a TLS channel. Unary calls give up after `timeout` seconds (streams have no deadline: a job
    may train for days). Errors are HyScaleError."""

    def __init__(self, server=None, token=None, token_file=None, tls_ca=None, timeout=10.0):
        server = server or os.environ.get("HYSCALE_SERVER") or "127.0.0.1:50051"
        if token is None and token_file:
            token = pathlib.Path(token_file).read_text().strip()
        if token is None:
            token = os.environ.get("HYSCALE_TOKEN") or None
        self._metadata = (("authorization", f"Bearer {token}"),) if token else ()
        self._timeout = timeout
        if tls_ca:
            credentials = grpc.ssl_channel_credentials(pathlib.Path(tls_ca).read_bytes())
            self._channel = grpc.secure_channel(server, credentials)
        else:
            self._channel = grpc.insecure_channel(server)
        self._jobs = service_pb2_grpc.JobServiceStub(self._channel)
        self._workers = service_pb2_grpc.WorkerServiceStub(self._channel)

    def close(self):
        self._channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *_):
        self.close()

    def _call(self, method, request):
        try:
            return method(request, timeout=self._timeout, metadata=self._metadata)
        except grpc.RpcError as error:
            raise HyScaleError(error.code().name, error.details()) from None

    def _stream(self, method, request):
        try:
            yield from method(request, metadata=self._metadata)
        except grpc.RpcError as error:
            raise HyScaleError(error.code().name, error.details()) from None

    @staticmethod
    def _resources(ranks, device, memory_bytes_per_rank):
        if device not in _DEVICE_KINDS:
            raise ValueError(f"device: must be cpu, gpu or any (got {device!r})")
        return service_pb2.Resources(ranks=ranks, device_kind=_DEVICE_KINDS[device],
                                     memory_bytes_per_rank=memory_bytes_per_rank)

    @staticmethod
    def _spec(spec):
        return spec if isinstance(spec, job_pb2.JobSpec) else load_spec(spec)

    def submit(self, spec, ranks=0, device="any", memory_bytes_per_rank=0, priority=0,
               max_restarts=0, request_id=""):
        """Submits a job (a JobSpec, or what load_spec takes); returns the Job as planned. A retry
        with the same request_id returns the first submission's job."""
        request = service_pb2.SubmitJobRequest(
            spec=self._spec(spec), resources=self._resources(ranks, device, memory_bytes_per_rank),
            priority=priority, max_restarts=max_restarts, request_id=request_id)
        return self._call(self._jobs.SubmitJob, request)

    def plan(self, spec, ranks=0, device="any"):
        """The coordinator's plan for a spec (feasibility, memory, step time), submitting nothing."""
        request = service_pb2.PlanJobRequest(spec=self._spec(spec),
                                              resources=self._resources(ranks, device, 0))
        return self._call(self._jobs.PlanJob, request)

    def get(self, job_id):
        return self._call(self._jobs.GetJob, service_pb2.GetJobRequest(job_id=job_id))

    def jobs(self, states=(), page_size=0):
        """Every job (newest first), or those in `states` (JobState values), page by page."""
        token = ""
        while True:
            page = self._call(self._jobs.ListJobs, service_pb2.ListJobsRequest(
                states=list(states), page_size=page_size, page_token=token))
            yield from page.jobs
            token = page.next_page_token
            if not token:
                return

    def cancel(self, job_id, reason=""):
        return self._call(self._jobs.CancelJob,
                          service_pb2.CancelJobRequest(job_id=job_id, reason=reason))

    def watch(self, job_id, after_sequence=0):
        """The job's events from after_sequence on (the current state first), as they happen;
        ends with the terminal state's event. A stream the coordinator drops (a restart) is
        reopened after the last event seen, for up to `timeout` seconds without contact, as
        `hyscale watch` does."""
        last, state, contact = after_sequence, None, time.monotonic()
        while True:
            request = service_pb2.WatchJobRequest(job_id=job_id, after_sequence=last)
            try:
                for event in self._jobs.WatchJob(request, metadata=self._metadata):
                    contact = time.monotonic()
                    if 0 < event.sequence <= last:
                        continue
                    last = max(last, event.sequence)
                    if event.WhichOneof("kind") == "state_change":
                        state = event.state_change.to
                    yield event
                if state in TERMINAL_STATES:
                    return
            except grpc.RpcError as error:
                if error.code() not in _TRANSIENT:
                    raise HyScaleError(error.code().name, error.details()) from None
                if time.monotonic() - contact > self._timeout:
                    raise HyScaleError(error.code().name, error.details()) from None
            if time.monotonic() - contact > self._timeout:
                raise HyScaleError("UNAVAILABLE", "the event stream ended before the job did")
            time.sleep(0.2)

    def wait(self, job_id):
        """Watches the job to its end and returns it, terminal."""
        for _ in self.watch(job_id):
            pass
        return self.get(job_id)

    def logs(self, job_id, rank=0, follow=False, offset=0):
        """The rank's log, in chunks of bytes; with follow, until the job ends."""
        request = service_pb2.StreamLogsRequest(job_id=job_id, rank=rank, follow=follow,
                                                offset=offset)
        for chunk in self._stream(self._jobs.StreamLogs, request):
            yield chunk.data

    def workers(self):
        """The registered workers (WorkerInfo), every page."""
        token = ""
        while True:
            page = self._call(self._workers.ListWorkers,
                              service_pb2.ListWorkersRequest(page_token=token))
            yield from page.workers
            token = page.next_page_token
            if not token:
                return
