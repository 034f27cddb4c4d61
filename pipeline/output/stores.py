"""Object stores (``s3://``, ``gs://``): one probe of every bucket a run names, before any work.

Beam's store clients are made for long jobs: an endpoint that does not answer is retried for about
ten minutes, a missing bucket lists as empty, and a bucket that refuses writes is found out by
the first worker that writes a shard. Here each bucket is asked once, with short timeouts and no
retries, using the same options and credentials as Beam's clients (``--s3_endpoint_url``,
``--s3_access_key_id``, ... for S3; the standard Google client environment for GCS, with
``STORAGE_EMULATOR_HOST`` for an emulator), and what it answers becomes one error line naming the
path. Output buckets are also written to (a small object, deleted at once), so read-only
credentials fail here rather than at the end of the job.
"""
from __future__ import annotations

import logging
import os
import threading
import uuid
from typing import TYPE_CHECKING, Any

from ..util.errors import UserError, first_line

if TYPE_CHECKING:
    from apache_beam.options.pipeline_options import PipelineOptions

LOG = logging.getLogger(__name__)
TIMEOUT_S = 10
PROBE = "_probe-"  # the object an output probe writes and deletes ("_": dataset readers skip it)


S3_FLAGS = ("s3_access_key_id", "s3_secret_access_key", "s3_session_token", "s3_endpoint_url", "s3_region_name",
            "s3_api_version", "s3_verify", "s3_disable_ssl")


_S3_CLIENTS: dict[tuple[Any, ...], Any] = {}
_S3_LOCK = threading.Lock()
RETRY_MODE, MAX_ATTEMPTS = "standard", 10
"""botocore's retries for the run's S3 requests (throttling, 5xx, connection errors), with
exponential backoff: ``AWS_RETRY_MODE`` (``standard``, ``adaptive``: also slows the client down
while S3 throttles) and ``AWS_MAX_ATTEMPTS`` replace them, as in every AWS SDK."""
_RETRIED = {"total": 0, "taken": 0}


def _count_retries(parsed: dict[str, Any] | None = None, **_: Any) -> None:
    """botocore's ``after-call`` event: how many times the call was retried before it succeeded."""
    attempts = (parsed or {}).get("ResponseMetadata", {}).get("RetryAttempts", 0)
    if attempts:
        with _S3_LOCK:
            _RETRIED["total"] += attempts


def take_retries() -> int:
    """S3 retries of this process since the last call (a step counts them; run.json has the sum)."""
    with _S3_LOCK:
        new = _RETRIED["total"] - _RETRIED["taken"]
        _RETRIED["taken"] = _RETRIED["total"]
    return new


def _client(opts: dict[str, Any], **config: Any) -> Any:
    """A boto3 S3 client with the options Beam's S3 filesystem takes (``--s3_*``)."""
    import boto3
    from botocore.config import Config

    return boto3.session.Session().client(
        "s3", region_name=opts.get("s3_region_name"), api_version=opts.get("s3_api_version"),
        use_ssl=not opts.get("s3_disable_ssl"), verify=opts.get("s3_verify"), endpoint_url=opts.get("s3_endpoint_url"),
        aws_access_key_id=opts.get("s3_access_key_id"), aws_secret_access_key=opts.get("s3_secret_access_key"),
        aws_session_token=opts.get("s3_session_token"), config=Config(**config))


def share_s3_clients() -> None:
    """Make Beam's S3 filesystem reuse one boto3 client per process and set of options.

    Beam builds a new boto3 session and client for every S3 operation (each ``exists``,
    ``rename``, ``open``); botocore then re-reads its service definitions, about 0.2 s a time,
    which made a run of two sample files from and to S3 spend 20 of its 30 s creating clients.
    boto3's clients are thread-safe; Beam's wrapper keeps its per-download state per instance.
    The shared client retries as :data:`RETRY_MODE` says (Beam's own has botocore's legacy
    5 attempts) and counts its retries (:func:`take_retries`).
    """
    from apache_beam.io.aws.clients.s3 import boto3_client
    from apache_beam.options.pipeline_options import PipelineOptions, S3Options

    if getattr(boto3_client.Client, "shared", False):
        return

    class SharedClient(boto3_client.Client):
        shared = True

        def __init__(self, options: Any) -> None:
            opts = options.view_as(S3Options).get_all_options() if isinstance(options, PipelineOptions) else options
            key = (os.getpid(), *(opts.get(k) for k in sorted(S3_FLAGS)))
            with _S3_LOCK:
                client = _S3_CLIENTS.get(key)
            if client is None:
                client = _client(opts, retries={"mode": os.environ.get("AWS_RETRY_MODE", RETRY_MODE),
                                                "total_max_attempts": int(os.environ.get("AWS_MAX_ATTEMPTS", MAX_ATTEMPTS))})
                client.meta.events.register("after-call.s3", _count_retries)
                with _S3_LOCK:
                    client = _S3_CLIENTS.setdefault(key, client)
            self.client = client
            self._download_request, self._download_stream, self._download_pos = None, None, 0

    boto3_client.Client = SharedClient


def add_arguments(parser: Any) -> None:
    """Beam's S3 options (``--s3_endpoint_url``, ``--s3_access_key_id``, ...) on a command that is
    not a Beam pipeline; gs:// takes Google's standard environment."""
    from apache_beam.options.pipeline_options import S3Options

    S3Options._add_argparse_args(parser.add_argument_group("object stores (s3://; gs:// uses Google's environment)"))


def options_of(args: Any) -> PipelineOptions:
    """The store options a command line of :func:`add_arguments` gave."""
    from apache_beam.options.pipeline_options import PipelineOptions

    given = {flag: getattr(args, flag) for flag in S3_FLAGS if getattr(args, flag, None) not in (None, False)}
    return PipelineOptions.from_dictionary(given)


def open_stores(args: Any, reads: dict[str, str], writes: dict[str, str] | None = None) -> dict[str, Any]:
    """For a command of :func:`add_arguments`: Beam's filesystems in this process take its store
    options, and the bucket of each path is probed (``{flag: path}``; ``writes`` must take a
    write). Returns the options as a dictionary, for worker processes."""
    from apache_beam.io.filesystems import FileSystems

    options = options_of(args)
    FileSystems.set_options(options)
    for what, path in reads.items():
        check(str(path), what, options)
    for what, path in (writes or {}).items():
        check(str(path), what, options, write=True)
    return options.get_all_options(drop_default=True)


def bucket_and_key(path: str) -> tuple[str, str]:
    bucket, _, key = path.split("://", 1)[1].partition("/")
    return bucket, key


def s3_client(options: PipelineOptions) -> Any:
    """A boto3 S3 client with the options Beam's S3 filesystem uses, failing fast (3 attempts:
    throttling is retried, an endpoint that does not answer is not waited for long)."""
    from apache_beam.options.pipeline_options import S3Options

    return _client(options.view_as(S3Options).get_all_options(), connect_timeout=TIMEOUT_S, read_timeout=TIMEOUT_S,
                   retries={"mode": "standard", "total_max_attempts": 3})  # a throttled probe is not a refusal


def _s3_reason(exc: Exception) -> str:
    from botocore.exceptions import ClientError, EndpointConnectionError, NoCredentialsError

    if isinstance(exc, NoCredentialsError):
        return "no S3 credentials (pass --s3_access_key_id/--s3_secret_access_key or set AWS_* variables)"
    if isinstance(exc, EndpointConnectionError):
        return f"the S3 endpoint cannot be reached ({exc})"
    if isinstance(exc, ClientError):
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        code = exc.response.get("Error", {}).get("Code", "")
        if status == 404 or code == "NoSuchBucket":
            return "does not exist (or these credentials cannot see it)"
        if status == 403:
            code = code if code and not code.isdigit() else "Forbidden"  # a HEAD answer has no error body
            return f"access denied ({code}: check the credentials and the bucket policy)"
        return f"{code}: {exc.response.get('Error', {}).get('Message', exc)}"
    return f"{type(exc).__name__}: {exc}"


def reason(exc: Exception) -> str:
    """A store client's error in a few words, for one error line."""
    if type(exc).__module__.startswith("botocore"):
        return _s3_reason(exc)
    return first_line(exc, 300, typed=True)


def _check_s3(bucket: str, key: str, options: PipelineOptions, write: bool) -> str | None:
    client = s3_client(options)
    try:
        client.head_bucket(Bucket=bucket)
        if write:
            client.put_object(Bucket=bucket, Key=key, Body=b"")
            client.delete_object(Bucket=bucket, Key=key)
    except Exception as exc:  # noqa: BLE001  every client failure becomes the reason in one line
        return _s3_reason(exc)
    return None


def gcs_credentials() -> None:
    """Without Google application-default credentials, use GCS anonymously at once (an emulator,
    a public bucket) rather than after Beam's four retries of the lookup (about 30 s per process)."""
    import google.auth
    from apache_beam.internal.gcp import auth
    from google.auth.exceptions import DefaultCredentialsError

    quiet = logging.getLogger("google.auth._default")
    level, quiet.level = quiet.level, logging.ERROR  # its own line about the metadata server, ours says it
    try:
        google.auth.default()
    except DefaultCredentialsError:
        if not os.environ.get("STORAGE_EMULATOR_HOST"):
            LOG.warning("no Google application-default credentials (gcloud auth application-default login, or "
                        "GOOGLE_APPLICATION_CREDENTIALS): using GCS anonymously")
        with auth._Credentials._credentials_lock:
            auth._Credentials._credentials_init, auth._Credentials._credentials = True, None
    finally:
        quiet.setLevel(level)


def _check_gcs(bucket: str, key: str, options: PipelineOptions, write: bool) -> str | None:
    from apache_beam.io.gcp.gcsio import create_storage_client

    gcs_credentials()
    try:
        client = create_storage_client(options)
        found = client.lookup_bucket(bucket, timeout=TIMEOUT_S, retry=None)
        if found is None:
            return "does not exist (or these credentials cannot see it)"
        if write:
            blob = found.blob(key)
            blob.upload_from_string(b"", timeout=TIMEOUT_S, retry=None)
            blob.delete(timeout=TIMEOUT_S, retry=None)
    except Exception as exc:  # noqa: BLE001  credentials, network, permissions: the client's own words
        return reason(exc)
    return None


_OPTIONS: list[PipelineOptions] = []  # the run's store options (:func:`use_options`), for the clients below
_CONDITIONAL: dict[tuple[int, str], Any] = {}  # (process, scheme): its client


def use_options(options: PipelineOptions) -> None:
    """The store options :func:`put_if` and :func:`read_versioned` reach the stores with in this process."""
    _OPTIONS[:] = [options]
    _CONDITIONAL.clear()


def _conditional_client(scheme: str) -> Any:
    """This process's client of ``scheme`` (``s3``, ``gs``) with the options :func:`use_options` gave."""
    key = (os.getpid(), scheme)
    if key not in _CONDITIONAL:
        from apache_beam.options.pipeline_options import PipelineOptions

        options = _OPTIONS[0] if _OPTIONS else PipelineOptions([])
        if scheme == "s3":  # the client Beam's S3 filesystem shares (:func:`share_s3_clients`)
            from apache_beam.io.aws.clients.s3 import boto3_client

            share_s3_clients()
            _CONDITIONAL[key] = boto3_client.Client(options).client
        else:
            from apache_beam.io.gcp.gcsio import create_storage_client

            gcs_credentials()
            _CONDITIONAL[key] = create_storage_client(options)
    return _CONDITIONAL[key]


def _refused(exc: Exception, scheme: str) -> bool:
    """Whether a store's error says a write's condition did not hold (or the object it names is gone)."""
    if scheme == "gs":
        from google.api_core import exceptions as google

        return isinstance(exc, (google.PreconditionFailed, google.NotFound))
    response = getattr(exc, "response", None)  # botocore's ClientError
    status = response.get("ResponseMetadata", {}).get("HTTPStatusCode") if isinstance(response, dict) else None
    return status in (404, 409, 412)  # 409: S3's ConditionalRequestConflict, another conditional write at once


def put_if(path: str, data: bytes, version: str | None) -> str | None:
    """Write ``data`` as the object at store path ``path`` only if that object is still at
    ``version`` (an S3 ETag, a GCS generation, as :func:`read_versioned` gives them) or, with
    None, only if there is none: S3's ``If-Match`` / ``If-None-Match: *``, GCS's
    ``ifGenerationMatch``. Returns the version written, or None where the condition did not hold.
    Of two such writes at once, at most one succeeds; a store that ignores the condition (an
    emulator without preconditions) writes the object anyway."""
    scheme, (bucket, key) = path.split("://", 1)[0], bucket_and_key(path)
    client = _conditional_client(scheme)
    try:
        if scheme == "s3":
            condition = {"IfNoneMatch": "*"} if version is None else {"IfMatch": version}
            return client.put_object(Bucket=bucket, Key=key, Body=data, **condition)["ETag"]
        blob = client.bucket(bucket).blob(key)
        blob.upload_from_string(data, if_generation_match=0 if version is None else int(version) if version.isdigit()
                                else None)  # (an emulator that gives no generation: no condition)
        return str(blob.generation)
    except Exception as exc:  # anything but a refused condition is the caller's
        if _refused(exc, scheme):
            return None
        raise


def read_versioned(path: str) -> tuple[bytes, str] | None:
    """The object at store path ``path`` and its version (for :func:`put_if`), or None where there is none."""
    scheme, (bucket, key) = path.split("://", 1)[0], bucket_and_key(path)
    client = _conditional_client(scheme)
    try:
        if scheme == "s3":
            from botocore.exceptions import IncompleteReadError, ResponseStreamingError

            for attempt in range(3):  # (botocore retries a request, not a body cut short: asked again)
                found = client.get_object(Bucket=bucket, Key=key)
                try:
                    return found["Body"].read(), found["ETag"]
                except (IncompleteReadError, ResponseStreamingError):
                    if attempt == 2:
                        raise
        blob = client.bucket(bucket).get_blob(key)
        if blob is None:
            return None
        return blob.download_as_bytes(if_generation_match=blob.generation), str(blob.generation)
    except Exception as exc:
        if _refused(exc, scheme):  # gone, or replaced between the two GCS calls: taken for gone
            # (the caller's next write tells)
            return None
        raise


def check(path: str, what: str, options: PipelineOptions, write: bool = False) -> None:
    """Nothing for a local path; for a bucket path, one error line when the bucket cannot be
    reached, does not exist, refuses these credentials, or (``write``) refuses a write below ``path``."""
    from apache_beam.io.filesystems import FileSystems

    scheme = FileSystems.get_scheme(path)
    if scheme not in ("s3", "gs"):
        return
    bucket, key = bucket_and_key(path)
    probe = f"{key.rstrip('/')}/{PROBE}{uuid.uuid4().hex[:12]}".lstrip("/")
    reason = (_check_s3 if scheme == "s3" else _check_gcs)(bucket, probe, options, write)
    if reason is None:
        return
    if reason.startswith("does not exist"):
        reason = f"bucket {scheme}://{bucket} {reason}"
    elif scheme == "gs" and "Connect" in reason:
        reason += f" (endpoint {os.environ.get('STORAGE_EMULATOR_HOST') or 'storage.googleapis.com'})"
    raise UserError(f"{what} {path}: {reason}")
