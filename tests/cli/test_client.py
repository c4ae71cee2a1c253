"""The Python client and the CLI against a scripted transport: config resolution, error mapping,
the SSE parser, stream resumption and the polling fallback, and the CLI's exit codes."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

import torchyard.cli.main as cli_main
from torchyard.cli.follow import RateEstimator
from torchyard.client import (
    ApiError,
    CheckpointEvent,
    Client,
    ConfigError,
    EndEvent,
    InvalidRequest,
    MetricEvent,
    NotFound,
    StatusEvent,
    expected_total_steps,
    load_config,
    load_spec,
)
from torchyard.client.sse import parse_sse

URL = "http://torchyard.test"
PROBLEM = {"Content-Type": "application/problem+json"}


def job(status: str = "running", **extra: Any) -> dict[str, Any]:
    spec = {"name": "tiny", "model": {"name": "mlp"}, "data": {"name": "synthetic-classification", "args": {"samples": 512}},
            "train": {"epochs": 2, "global_batch_size": 32}}
    return {"id": "j1", "name": "tiny", "status": status, "spec": spec, "attempt": 1, "max_attempts": 1, "last_step": 4,
            "latest_metrics": {"train/loss": 0.5}, "error": None, **extra}


def make_client(handler: Callable[[httpx.Request], httpx.Response]) -> Client:
    return Client(URL, "k", transport=httpx.MockTransport(handler))


# ---------------------------------------------------------------------------------------------- config


def test_config_precedence_argument_env_file(tmp_path: Path) -> None:
    file = tmp_path / "config.toml"
    file.write_text('url = "http://from-file:1"\napi_key = "file-key"\n')
    env = {"TORCHYARD_CONFIG": str(file)}
    assert load_config(env=env) == load_config(path=file, env={})
    cfg = load_config(env=env)
    assert (cfg.url, cfg.api_key, cfg.source) == ("http://from-file:1", "file-key", str(file))
    cfg = load_config(env={**env, "TORCHYARD_API_KEY": "env-key"})
    assert (cfg.url, cfg.api_key, cfg.source) == ("http://from-file:1", "env-key", "environment")
    cfg = load_config(url="http://arg/", api_key="arg-key", env={**env, "TORCHYARD_URL": "http://env"})
    assert (cfg.url, cfg.api_key) == ("http://arg", "arg-key")
    cfg = load_config(env={"XDG_CONFIG_HOME": str(tmp_path / "none")})
    assert (cfg.url, cfg.api_key, cfg.source) == ("http://127.0.0.1:8000", None, "none")


def test_config_file_with_unknown_keys_is_refused(tmp_path: Path) -> None:
    file = tmp_path / "config.toml"
    file.write_text('url = "http://x"\ntoken = "typo"\n')
    with pytest.raises(ConfigError, match="token"):
        load_config(path=file, env={})


def test_load_spec_reads_yaml_and_json_and_names_the_file(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text("name: a\nmodel: {name: mlp}\n")
    (tmp_path / "b.json").write_text('{"name": "b"}')
    (tmp_path / "c.yaml").write_text("- not a mapping\n")
    assert load_spec(tmp_path / "a.yaml") == {"name": "a", "model": {"name": "mlp"}}
    assert load_spec(tmp_path / "b.json") == {"name": "b"}
    with pytest.raises(Exception, match="c.yaml: a job spec must be a mapping"):
        load_spec(tmp_path / "c.yaml")


def test_expected_total_steps_mirrors_the_trainer() -> None:
    spec = job()["spec"]
    assert expected_total_steps(spec) == 2 * (512 // 32)
    assert expected_total_steps({**spec, "train": {**spec["train"], "max_steps": 5}}) == 5
    assert expected_total_steps({"data": {"name": "synthetic-lm"}, "train": {"global_batch_size": 64}}) == 4096 // 64
    assert expected_total_steps({"data": {"name": "text-file", "args": {"path": "x"}}}) is None


# ---------------------------------------------------------------------------------------------- errors


def test_problem_json_becomes_typed_errors() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/jobs" and request.method == "POST":
            body = {"status": 422, "detail": "train.global_batch_size: 63 is not divisible",
                    "errors": [{"field": "train.global_batch_size", "message": "63 is not divisible"}]}
            return httpx.Response(422, json=body, headers=PROBLEM)
        if request.url.path == "/v1/jobs/nope":
            return httpx.Response(404, json={"status": 404, "detail": "job nope not found"}, headers=PROBLEM)
        return httpx.Response(502, text="<html>bad gateway</html>")

    with make_client(handler) as c:
        with pytest.raises(InvalidRequest) as invalid:
            c.submit({"name": "x"})
        assert invalid.value.problems[0]["field"] == "train.global_batch_size"
        with pytest.raises(NotFound, match="job nope not found"):
            c.job("nope")
        with pytest.raises(ApiError) as bad_gateway:
            c.health()
        assert bad_gateway.value.status_code == 502 and "bad gateway" in bad_gateway.value.detail


def test_metrics_follow_cursors() -> None:
    pages = {None: {"items": [{"step": 1, "name": "train/loss", "value": 2.0, "time": 1.0}], "next_cursor": "c1"},
             "c1": {"items": [{"step": 2, "name": "train/loss", "value": 1.0, "time": 2.0}], "next_cursor": None}}

    def handler(request: httpx.Request) -> httpx.Response:
        assert request.headers["Authorization"] == "Bearer k"
        assert request.url.params.get_list("name") == ["train/loss"]
        return httpx.Response(200, json=pages[request.url.params.get("cursor")])

    with make_client(handler) as c:
        assert [p.value for p in c.metrics("j1", "train/loss")] == [2.0, 1.0]


# ---------------------------------------------------------------------------------------------- streams


def test_sse_parser_handles_comments_multiline_data_crlf_and_ids() -> None:
    text = ": ping\r\nevent: metric\r\nid: 7\r\ndata: {\"a\":\r\ndata: 1}\r\n\r\nevent: end\ndata: {}\n\n"
    events = list(parse_sse(text.splitlines(keepends=True)))
    assert [(e.event, e.data, e.id) for e in events] == [("metric", '{"a":\n1}', "7"), ("end", "{}", "7")]


def sse(*events: tuple[str, str, dict[str, Any]]) -> bytes:
    return "".join(f"id: {i}\nevent: {t}\ndata: {json.dumps(d)}\n\n" for i, t, d in events).encode()


def test_stream_resumes_with_last_event_id_after_a_drop() -> None:
    seen_ids: list[str | None] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen_ids.append(request.headers.get("Last-Event-ID"))
        if len(seen_ids) == 1:  # the first connection drops before the end event
            body = sse(("1", "status", {"status": "running", "attempt": 1}), ("2", "metric", {"step": 4, "values": {"train/loss": 1.0}}))
        else:
            body = sse(("3", "checkpoint", {"step": 4, "path": "/r/ckpt"}), ("4", "end", {"status": "succeeded"}))
        return httpx.Response(200, content=body, headers={"Content-Type": "text/event-stream"})

    with make_client(handler) as c:
        events = list(c.stream("j1"))
    assert seen_ids == [None, "2"]
    assert [type(e) for e in events] == [StatusEvent, MetricEvent, CheckpointEvent, EndEvent]
    assert events[1].values == {"train/loss": 1.0} and events[-1].status == "succeeded"


def test_stream_polls_when_the_server_has_no_events_endpoint() -> None:
    statuses = iter(["running", "running", "succeeded"])  # the first look tells a missing route from a missing job
    metrics = [{"step": 4, "name": "train/loss", "value": 1.0, "time": 1.0},
               {"step": 8, "name": "eval/loss", "value": 0.9, "time": 2.0}, {"step": 8, "name": "train/loss", "value": 0.8, "time": 2.0}]

    def handler(request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path.endswith("/events"):
            return httpx.Response(404, json={"status": 404, "detail": "Not Found"}, headers=PROBLEM)
        if path.endswith("/metrics"):
            since = int(request.url.params.get("since_step", 0))
            return httpx.Response(200, json={"items": [m for m in metrics if m["step"] >= since], "next_cursor": None})
        if path.endswith("/checkpoints"):
            return httpx.Response(200, json={"items": [{"step": 8, "path": "/r/c8", "epoch": 0}]})
        return httpx.Response(200, json=job(next(statuses, "succeeded")))

    with make_client(handler) as c:
        events = list(c.stream("j1", poll_interval=0.01))
    kinds = [(type(e).__name__, getattr(e, "step", None) or getattr(e, "status", None)) for e in events]
    assert kinds == [("MetricEvent", 4), ("MetricEvent", 8), ("CheckpointEvent", 8), ("StatusEvent", "running"),
                     ("StatusEvent", "succeeded"), ("EndEvent", "succeeded")]
    assert events[1].values == {"eval/loss": 0.9, "train/loss": 0.8}


def test_rate_estimator_uses_event_times_and_restarts_after_a_resume() -> None:
    rate = RateEstimator(window_s=30)
    assert rate.eta_s(0, 100) is None
    rate.add(10, now=100.0)
    rate.add(30, now=110.0)
    assert rate.steps_per_s == pytest.approx(2.0)
    assert rate.eta_s(30, 100) == pytest.approx(35.0)
    rate.add(5, now=111.0)  # a retry resumed from an earlier checkpoint
    assert rate.steps_per_s is None


# ---------------------------------------------------------------------------------------------- CLI exit codes


@pytest.fixture
def fake_api(monkeypatch: pytest.MonkeyPatch) -> Callable[[Callable[[httpx.Request], httpx.Response]], None]:
    def install(handler: Callable[[httpx.Request], httpx.Response]) -> None:
        monkeypatch.setattr(cli_main.CliContext, "client", lambda self: make_client(handler))

    return install


def followed_job(final: str) -> Callable[[httpx.Request], httpx.Response]:
    error = {"type": "training_error", "message": "boom", "exit_code": 1, "traceback": "Traceback: boom", "log_tail": None}

    def handler(request: httpx.Request) -> httpx.Response:
        if request.method == "POST":
            return httpx.Response(201, json=job("queued", queue_position=0))
        if request.url.path.endswith("/events"):
            body = sse(("1", "status", {"status": "running"}), ("2", "metric", {"step": 16, "values": {"train/loss": 0.4}, "time": 5.0}),
                       ("3", "status", {"status": final}), ("4", "end", {"status": final}))
            return httpx.Response(200, content=body, headers={"Content-Type": "text/event-stream"})
        return httpx.Response(200, json=job(final, error=error if final == "failed" else None))

    return handler


@pytest.mark.parametrize(("final", "code"), [("succeeded", 0), ("failed", 1), ("cancelled", 3)])
def test_submit_follow_exit_code_follows_the_job(final: str, code: int, fake_api: Any, tmp_path: Path) -> None:
    spec = tmp_path / "job.yaml"
    spec.write_text("name: tiny\nmodel: {name: mlp}\ndata: {name: synthetic-classification}\n")
    fake_api(followed_job(final))
    result = CliRunner().invoke(cli_main.app, ["submit", str(spec), "--follow"])
    assert result.exit_code == code, result.output
    assert "step 16/32" in result.output and f"j1 {final}" in result.output
    if final == "failed":
        assert "training_error" in result.output and "boom" in result.output


def test_cli_exit_codes_for_bad_input_refusals_and_an_unreachable_api(fake_api: Any, tmp_path: Path) -> None:
    runner = CliRunner()
    missing = runner.invoke(cli_main.app, ["submit", str(tmp_path / "missing.yaml")])
    assert missing.exit_code == 2 and "missing.yaml" in missing.output

    spec = tmp_path / "job.yaml"
    spec.write_text("name: x\n")
    fake_api(lambda r: httpx.Response(422, json={"status": 422, "detail": "model: Field required"}, headers=PROBLEM))
    refused = runner.invoke(cli_main.app, ["submit", str(spec)])
    assert refused.exit_code == 4 and "model: Field required" in refused.output

    fake_api(lambda r: httpx.Response(409, json={"status": 409, "detail": "job j1 is already succeeded"}, headers=PROBLEM))
    conflict = runner.invoke(cli_main.app, ["cancel", "j1"])
    assert conflict.exit_code == 4 and "already succeeded" in conflict.output

    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    fake_api(refuse)
    down = runner.invoke(cli_main.app, ["ls"])
    assert down.exit_code == 5 and "cannot reach" in down.output


def test_submit_applies_name_labels_and_set_overrides(fake_api: Any, tmp_path: Path) -> None:
    sent: list[dict[str, Any]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        sent.append(json.loads(request.content))
        return httpx.Response(201, json=job("queued"))

    spec = tmp_path / "job.yaml"
    spec.write_text("name: x\ntrain: {lr: 0.1}\nlabels: {team: a}\n")
    fake_api(handler)
    result = CliRunner().invoke(cli_main.app, ["submit", str(spec), "-q", "--name", "y", "-l", "run=3", "--set", "train.lr=0.01",
                                               "--set", "eval.every_steps=5"])
    assert result.exit_code == 0, result.output
    assert result.output.strip() == "j1"
    assert sent == [{"name": "y", "train": {"lr": 0.01}, "labels": {"team": "a", "run": "3"}, "eval": {"every_steps": 5}}]
