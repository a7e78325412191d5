"""HTTP benchmark (issue 3): the running service over loopback, beside the in-process engine.

Trains ``RandomForestClassifier(n_estimators=100, max_depth=5, random_state=0)`` on a dataset
(COMPAS by default: its maps build in well under a second), saves it with skops together with
the declared schema as an upload spec, starts the real server (``python -m app.cli serve``) on
a free loopback port with a temporary data dir and an admin token, uploads the model and
waits for its maps. Then, per norm, over one keep-alive ``httpx.Client``:

* ``single``: N requests with one test row each (``{"instance": [...]}``);
* ``batch100``: M requests with 100 rows each (``{"instances": [...]}``);

and, for singles, a closed loop of T client threads (each with its own client). Latency is
the client-observed time of ``client.post`` (request bodies are serialised beforehand; the
response is read in full). Beside it, the same persisted maps are loaded in this process
(``CounterfactualMaps.load(<data dir>/models/<id>/maps)``) and timed on the same rows:
``maps.counterfactual(x)`` per row and ``maps.counterfactuals(X100)`` per batch, alternating
with the HTTP runs in chunks so that both see the same machine load. The HTTP overhead is
HTTP p50 minus in-process p50. Every HTTP answer's certified distance is checked
against the in-process answer.

Targets (issue 3, 100-tree depth-5 forest): single-counterfactual HTTP p50 < 5 ms, and the
HTTP layer adding < 2 ms to the in-process time.

    python -m benchmarks.bench_http [--dataset CP] [--quick] [--norms l1,l2] [--threads 2,4]

Prints a markdown table and writes it to ``benchmarks/results/http.md`` (``--out``).
"""

from __future__ import annotations

import argparse
import datetime as dt
import http.client
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

ADMIN_TOKEN = "bench-admin-token"
TARGET_P50_MS = 5.0
TARGET_OVERHEAD_MS = 2.0
BATCH = 100
CHUNK = 50  # singles per alternation between HTTP and in-process
BATCH_CHUNK = 5


# --------------------------------------------------------------------------------------------
# Setup: model, spec, server
# --------------------------------------------------------------------------------------------
def make_model(dataset: str, workdir: Path) -> tuple[Path, Path, np.ndarray, Any]:
    """Train the forest, write ``model.skops`` and ``spec.json``; return the test rows too."""
    import skops.io as sio
    from sklearn.ensemble import RandomForestClassifier

    from benchmarks.common import load

    Xtr, Xte, ytr, _yte, schema = load(dataset)
    model = RandomForestClassifier(n_estimators=100, max_depth=5, random_state=0).fit(Xtr, ytr)
    model_path = workdir / "model.skops"
    sio.dump(model, model_path)
    spec_path = workdir / "spec.json"
    spec_path.write_text(json.dumps({"name": f"bench-{dataset}", "features": schema.to_dicts()}))
    return model_path, spec_path, np.asarray(Xte, dtype=np.float64), model


def proc_cpu(pid: int) -> float:
    """CPU seconds (user + system, all threads) used so far by process ``pid`` (Linux)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _die_with_parent() -> None:
    """In the server child (Linux): get SIGTERM if the benchmark dies, even by SIGKILL."""
    import ctypes

    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


class Server:
    """``python -m app.cli serve`` in a subprocess; always stopped by :meth:`stop`."""

    def __init__(self, data_dir: Path, port: int, log_path: Path, python: str,
                 workers: int | None = None) -> None:
        env = dict(os.environ)
        env["CFMAPS_ADMIN_TOKEN"] = ADMIN_TOKEN
        env.pop("CFMAPS_API_TOKENS", None)
        env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
        self.log_path = log_path
        self._log = open(log_path, "wb")  # closed in stop()
        self.proc = subprocess.Popen(
            [python, "-m", "app.cli", "serve", "--host", "127.0.0.1", "--port", str(port),
             "--data-dir", str(data_dir), "--log-level", "warning",
             *([] if workers is None else ["--workers", str(workers)])],
            cwd=ROOT, env=env, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            preexec_fn=_die_with_parent if sys.platform == "linux" else None,
        )
        self.base = f"http://127.0.0.1:{port}"

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log_tail(self, n: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=15)
        self._log.close()


def wait_until(what: str, check, server: Server, timeout: float, interval: float = 0.1) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not server.alive():
            raise RuntimeError(f"the server exited while waiting for {what}:\n{server.log_tail()}")
        try:
            out = check()
        except Exception:  # not up yet
            out = None
        if out:
            return out
        time.sleep(interval)
    raise RuntimeError(f"timed out after {timeout:.0f} s waiting for {what}:\n{server.log_tail()}")


def upload(client: Any, server: Server, model_path: Path, spec_path: Path, timeout: float) -> dict:
    auth = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    with open(model_path, "rb") as fh:
        r = client.post(
            "/v1/models",
            files={"model": ("model.skops", fh, "application/octet-stream")},
            data={"spec": spec_path.read_text()},
            headers=auth,
        )
    if r.status_code != 202:
        raise RuntimeError(f"upload answered {r.status_code}: {r.text}")
    model_id = r.json()["id"]

    def ready() -> dict | None:
        doc = client.get(f"/v1/models/{model_id}").json()
        if doc["status"] == "failed":
            raise RuntimeError(f"the build failed: {doc['error']}")
        return doc if doc["status"] == "ready" else None

    deadline = time.monotonic() + timeout
    while True:
        doc = ready()
        if doc:
            return doc
        if time.monotonic() > deadline or not server.alive():
            raise RuntimeError(f"the model did not become ready:\n{server.log_tail()}")
        time.sleep(0.2)


# --------------------------------------------------------------------------------------------
# Measurements
# --------------------------------------------------------------------------------------------
@dataclass
class Timing:
    """Per-request latencies (seconds) and counterfactuals answered."""

    lat: list[float] = field(default_factory=list)
    wall: float = 0.0
    answered: int = 0
    cpu: float = 0.0  # CPU seconds of the measuring thread (client side, or the engine)

    def add(self, other: Timing) -> None:
        self.lat += other.lat
        self.wall += other.wall
        self.answered += other.answered
        self.cpu += other.cpu

    def cpu_ms(self) -> float:
        """CPU milliseconds per request."""
        return self.cpu / len(self.lat) * 1e3 if self.lat else float("nan")

    def p(self, q: float) -> float:
        return float(np.percentile(self.lat, q)) * 1e3 if self.lat else float("nan")

    @property
    def throughput(self) -> float:
        return self.answered / self.wall if self.wall > 0 else float("nan")


def bodies_single(X: np.ndarray, norm: str) -> list[bytes]:
    return [json.dumps({"instance": x.tolist(), "norm": norm}).encode() for x in X]


def bodies_batch(batches: list[np.ndarray], norm: str) -> list[bytes]:
    return [json.dumps({"instances": B.tolist(), "norm": norm}).encode() for B in batches]


HEADERS = {"Content-Type": "application/json"}


def run_http(client: Any, path: str, bodies: list[bytes], per_request: int) -> tuple[Timing, list[bytes]]:
    t = Timing()
    answers = []
    c0 = time.thread_time()
    w0 = time.perf_counter()
    for b in bodies:
        s = time.perf_counter()
        r = client.post(path, content=b, headers=HEADERS)
        e = time.perf_counter()
        if r.status_code != 200:
            raise RuntimeError(f"{path} answered {r.status_code}: {r.text[:500]}")
        t.lat.append(e - s)
        answers.append(r.content)
    t.wall = time.perf_counter() - w0
    t.cpu = time.thread_time() - c0
    t.answered = len(bodies) * per_request
    return t, answers


def run_stdlib(port: int, path: str, bodies: list[bytes]) -> Timing:
    """Singles over ``http.client`` (a leaner client than httpx): how much is the client's."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    t = Timing()
    try:
        w0 = time.perf_counter()
        for b in bodies:
            s = time.perf_counter()
            conn.request("POST", path, body=b, headers=HEADERS)
            resp = conn.getresponse()
            resp.read()
            t.lat.append(time.perf_counter() - s)
            if resp.status != 200:
                raise RuntimeError(f"{path} answered {resp.status}")
        t.wall = time.perf_counter() - w0
    finally:
        conn.close()
    t.answered = len(bodies)
    return t


def run_concurrent(base: str, path: str, bodies: list[bytes], threads: int) -> Timing:
    """Closed loop: ``threads`` clients, each sending its share of ``bodies`` back to back."""
    import httpx

    shares = [bodies[i::threads] for i in range(threads)]
    lats: list[list[float]] = [[] for _ in range(threads)]
    errors: list[str] = []
    barrier = threading.Barrier(threads + 1, timeout=60)  # a failed worker cannot hang us

    def worker(i: int) -> None:
        try:
            with httpx.Client(base_url=base, timeout=60) as c:
                c.get("/healthz")  # open the connection before the clock starts
                barrier.wait()
                for b in shares[i]:
                    s = time.perf_counter()
                    r = c.post(path, content=b, headers=HEADERS)
                    lats[i].append(time.perf_counter() - s)
                    if r.status_code != 200:
                        errors.append(f"{r.status_code}: {r.text[:200]}")
                        return
        except Exception as exc:
            errors.append(f"{type(exc).__name__}: {exc}")
            barrier.abort()

    ts = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(threads)]
    for th in ts:
        th.start()
    try:
        barrier.wait()
    except threading.BrokenBarrierError:
        raise RuntimeError(f"a client thread failed to start: {errors[:3]}") from None
    w0 = time.perf_counter()
    for th in ts:
        th.join(timeout=600)
    t = Timing(lat=[x for lst in lats for x in lst], wall=time.perf_counter() - w0)
    if errors or any(th.is_alive() for th in ts):
        raise RuntimeError(f"concurrent run failed: {errors[:3] or 'a client thread hung'}")
    t.answered = len(t.lat)
    return t


def run_inprocess_single(maps: Any, X: np.ndarray, norm: str) -> tuple[Timing, list[float]]:
    t = Timing()
    dists = []
    c0 = time.thread_time()
    w0 = time.perf_counter()
    for x in X:
        s = time.perf_counter()
        r = maps.counterfactual(x, norm=norm)
        t.lat.append(time.perf_counter() - s)
        dists.append(float("nan") if r.best is None else float(r.best.distance))
    t.wall = time.perf_counter() - w0
    t.cpu = time.thread_time() - c0
    t.answered = len(X)
    return t, dists


def run_inprocess_batch(maps: Any, batches: list[np.ndarray], norm: str) -> Timing:
    t = Timing()
    c0 = time.thread_time()
    w0 = time.perf_counter()
    for B in batches:
        s = time.perf_counter()
        maps.counterfactuals(B, norm=norm)
        t.lat.append(time.perf_counter() - s)
    t.wall = time.perf_counter() - w0
    t.cpu = time.thread_time() - c0
    t.answered = sum(len(B) for B in batches)
    return t


def engine_seconds(answers: list[bytes]) -> list[float]:
    """The engine's own ``stats.seconds`` per instance, as the server measured it."""
    out = []
    for a in answers:
        doc = json.loads(a)
        for r in doc.get("results", [doc]):
            out.append(float(r["stats"]["seconds"]))
    return out


def check_distances(answers: list[bytes], expected: list[float]) -> int:
    """Number of HTTP answers whose certified distance differs from the in-process one."""
    bad = 0
    for a, d in zip(answers, expected, strict=True):
        got = json.loads(a)["distance"]
        if got is None and np.isnan(d):
            continue
        if got is None or not np.isclose(got, d, rtol=1e-9, atol=1e-12):
            bad += 1
    return bad


# --------------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------------
def machine() -> str:
    cpu = platform.processor() or "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        n = len(os.sched_getaffinity(0))
    except AttributeError:
        n = os.cpu_count() or 0
    from importlib.metadata import version

    libs = ", ".join(f"{p} {version(p)}" for p in ("fastapi", "uvicorn", "pydantic", "httpx"))
    return f"{n} CPUs (nproc), {cpu}, Python {platform.python_version()}; {libs}"


def server_stack(python: str) -> str:
    """uvicorn's HTTP parser and event loop in the server's Python (it picks the fastest),
    and whether ``cfmaps serve`` writes each response at once (``app/server.py``)."""
    code = ("import importlib.util as u; print(('httptools' if u.find_spec('httptools') else 'h11')"
            " + ' + ' + ('uvloop' if u.find_spec('uvloop') else 'asyncio')"
            " + (', one write per response' if u.find_spec('app.server') else ''))")
    try:
        out = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=60,
                             cwd=ROOT)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return out.stdout.strip() or "unknown"


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def fmt(v: float, digits: int = 3) -> str:
    return "n/a" if not np.isfinite(v) else f"{v:.{digits}f}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dataset", default="CP", help="BC, CP, FI or PD (default: CP)")
    ap.add_argument("--singles", type=int, default=1000, help="single requests per norm")
    ap.add_argument("--batches", type=int, default=50, help="100-row requests per norm")
    ap.add_argument("--norms", default="l1,l2", help="comma-separated (default: l1,l2)")
    ap.add_argument("--threads", default="2,4", help="client threads for the closed loop")
    ap.add_argument("--quick", action="store_true", help="200 singles and 10 batches per norm")
    ap.add_argument("--build-timeout", type=float, default=900.0, help="seconds to wait for the maps")
    ap.add_argument("--out", default=str(HERE / "results" / "http.md"), help="markdown output")
    ap.add_argument("--no-write", action="store_true", help="print only")
    ap.add_argument("--server-python", default=sys.executable,
                    help="Python that runs the server (default: this one), e.g. an environment "
                    "with uvicorn[standard] (httptools, uvloop) to compare")
    a = ap.parse_args()
    if a.quick:
        a.singles, a.batches = min(a.singles, 200), min(a.batches, 10)
    norms = [n.strip() for n in a.norms.split(",") if n.strip()]
    thread_counts = [int(t) for t in a.threads.split(",") if t.strip()]

    import httpx

    from maps_core import CounterfactualMaps

    # SIGTERM (timeout, kill) unwinds like Ctrl-C, through the finally that stops the server.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    with tempfile.TemporaryDirectory(prefix="cfmaps-bench-http-") as tmp:
        tmpd = Path(tmp)
        data_dir = tmpd / "data"
        say(f"training RandomForestClassifier(100, max_depth=5) on {a.dataset}...")
        model_path, spec_path, Xte, _model = make_model(a.dataset, tmpd)
        rows = np.resize(Xte, (max(a.singles, 1), Xte.shape[1]))  # cycles when N > test rows
        batch_rows = np.resize(Xte, (a.batches * BATCH, Xte.shape[1]))
        batches = [batch_rows[i * BATCH:(i + 1) * BATCH] for i in range(a.batches)]

        load_before = os.getloadavg()
        port = free_port()
        server = Server(data_dir, port, tmpd / "server.log", a.server_python)
        results: dict[str, Any] = {}
        try:
            with httpx.Client(base_url=server.base, timeout=120) as client:
                wait_until("/healthz", lambda: client.get("/healthz").status_code == 200, server, 120)
                say(f"server up at {server.base}; uploading and building the maps...")
                info = upload(client, server, model_path, spec_path, a.build_timeout)
                model_id = info["id"]
                say(f"model {model_id} ready: {info['stats']['rectangles']} rectangles, built in "
                    f"{info['stats']['seconds']:.2f} s, {info['stats']['mixed_regions']} mixed regions")
                path = f"/v1/models/{model_id}/counterfactuals"
                # The same persisted maps, in this process. HTTP and in-process runs alternate
                # in chunks so that both see the same machine load.
                maps = CounterfactualMaps.load(data_dir / "models" / model_id / "maps")
                for norm in norms:
                    sb, bb = bodies_single(rows, norm), bodies_batch(batches, norm)
                    run_http(client, path, sb[:100], 1)  # warm-up: JIT, caches, connection
                    run_http(client, path, bb[:3], BATCH)
                    run_inprocess_single(maps, rows[:100], norm)
                    run_inprocess_batch(maps, batches[:3], norm)
                    single, single_ip, answers, dists = Timing(), Timing(), [], []
                    # The server idles while the in-process chunks run, so its CPU time over
                    # the whole phase is the CPU time of the HTTP requests.
                    srv0 = proc_cpu(server.proc.pid)
                    for i in range(0, len(sb), CHUNK):
                        t, ans = run_http(client, path, sb[i:i + CHUNK], 1)
                        single.add(t)
                        answers += ans
                        t, d = run_inprocess_single(maps, rows[i:i + CHUNK], norm)
                        single_ip.add(t)
                        dists += d
                    srv_single = proc_cpu(server.proc.pid) - srv0
                    batch, batch_ip, batch_answers = Timing(), Timing(), []
                    srv0 = proc_cpu(server.proc.pid)
                    for i in range(0, len(bb), BATCH_CHUNK):
                        t, ans = run_http(client, path, bb[i:i + BATCH_CHUNK], BATCH)
                        batch.add(t)
                        batch_answers += ans
                        batch_ip.add(run_inprocess_batch(maps, batches[i:i + BATCH_CHUNK], norm))
                    srv_batch = proc_cpu(server.proc.pid) - srv0
                    stdlib = run_stdlib(port, path, sb)
                    conc = {n: run_concurrent(server.base, path, sb, n) for n in thread_counts}
                    results[norm] = {
                        "single": single, "batch": batch, "stdlib": stdlib, "conc": conc,
                        "inproc_single": single_ip, "inproc_batch": batch_ip,
                        "mismatches": check_distances(answers, dists),
                        "engine_single": engine_seconds(answers),
                        "engine_batch": engine_seconds(batch_answers),
                        "server_cpu_single": srv_single / len(sb) * 1e3,
                        "server_cpu_batch": srv_batch / len(bb) * 1e3,
                    }
                    say(f"{norm}: single p50 HTTP {single.p(50):.3f} ms, in-process "
                        f"{single_ip.p(50):.3f} ms; batch of {BATCH} p50 HTTP {batch.p(50):.2f} ms, "
                        f"in-process {batch_ip.p(50):.2f} ms")
            load_after = os.getloadavg()
        finally:
            server.stop()

    # -- table -----------------------------------------------------------------------------
    stamp = dt.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
    lines = [
        f"# HTTP benchmark ({a.dataset}, RandomForestClassifier(100, max_depth=5))",
        "",
        f"`python -m benchmarks.bench_http{' --quick' if a.quick else ''}"
        f"{'' if a.dataset == 'CP' else ' --dataset ' + a.dataset}` on {stamp}.",
        f"Machine: {machine()}. Load average (1 min) {load_before[0]:.2f} before, "
        f"{load_after[0]:.2f} after (the benchmark itself adds up to 2; more means other "
        "processes competed for the CPUs).",
        f"Model: {info['stats']['rectangles']} rectangles, maps built in "
        f"{info['stats']['seconds']:.2f} s by the server; {a.singles} single requests and "
        f"{a.batches} requests of {BATCH} instances per norm, test rows of the 80/20 split; "
        "one keep-alive `httpx.Client`, server `cfmaps serve` (uvicorn, 1 process, "
        f"{server_stack(a.server_python)}) on loopback.",
        "",
        "Latency in ms per request (a batch request answers 100 counterfactuals); throughput in "
        "counterfactuals per second; overhead = HTTP p50 - in-process p50; engine = the "
        "`stats.seconds` the server reports per instance (median).",
        "",
        "| request | norm | HTTP p50 | HTTP p99 | HTTP cf/s | in-process p50 | in-process p99 "
        "| in-process cf/s | overhead p50 | engine in server p50 |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    verdicts = []
    for norm in norms:
        r = results[norm]
        s, b, si, bi = r["single"], r["batch"], r["inproc_single"], r["inproc_batch"]
        eng_s = float(np.median(r["engine_single"])) * 1e3
        eng_b = float(np.median(r["engine_batch"])) * 1e3 * BATCH
        lines.append(
            f"| single | {norm} | {fmt(s.p(50))} | {fmt(s.p(99))} | {s.throughput:.0f} "
            f"| {fmt(si.p(50))} | {fmt(si.p(99))} | {si.throughput:.0f} "
            f"| {fmt(s.p(50) - si.p(50))} | {fmt(eng_s)} |"
        )
        lines.append(
            f"| batch of {BATCH} | {norm} | {fmt(b.p(50), 2)} | {fmt(b.p(99), 2)} "
            f"| {b.throughput:.0f} | {fmt(bi.p(50), 2)} | {fmt(bi.p(99), 2)} | {bi.throughput:.0f} "
            f"| {fmt(b.p(50) - bi.p(50), 2)} | {fmt(eng_b, 2)} (x{BATCH}) |"
        )
        verdicts.append((norm, s.p(50), s.p(50) - si.p(50)))
    lines += [
        "",
        "CPU milliseconds per request, which the load of other processes barely changes: the "
        "server process (all threads, from /proc), the same queries in-process (the engine "
        "alone), their difference (what the HTTP stack, validation and JSON cost the server), "
        "and the `httpx` client's thread.",
        "",
        "| request | norm | server CPU | in-process CPU | server overhead CPU | client CPU |",
        "|---|---|---|---|---|---|",
    ]
    for norm in norms:
        r = results[norm]
        for label, key, http_t, ip_t in (("single", "single", r["single"], r["inproc_single"]),
                                         (f"batch of {BATCH}", "batch", r["batch"], r["inproc_batch"])):
            srv = r[f"server_cpu_{key}"]
            lines.append(f"| {label} | {norm} | {fmt(srv)} | {fmt(ip_t.cpu_ms())} "
                         f"| {fmt(srv - ip_t.cpu_ms())} | {fmt(http_t.cpu_ms())} |")
    lines += [
        "",
        "Singles with other clients (same server, same requests):",
        "",
        "| client | norm | p50 | p99 | cf/s |",
        "|---|---|---|---|---|",
    ]
    for norm in norms:
        r = results[norm]
        st = r["stdlib"]
        lines.append(f"| `http.client`, 1 connection | {norm} | {fmt(st.p(50))} | {fmt(st.p(99))} "
                     f"| {st.throughput:.0f} |")
        for n, c in r["conc"].items():
            lines.append(f"| {n} `httpx` threads, closed loop | {norm} | {fmt(c.p(50))} "
                         f"| {fmt(c.p(99))} | {c.throughput:.0f} |")
    lines += ["", "Targets (single counterfactual): HTTP p50 < "
              f"{TARGET_P50_MS:g} ms, HTTP overhead < {TARGET_OVERHEAD_MS:g} ms.", ""]
    ok = True
    for norm, p50, over in verdicts:
        met = p50 < TARGET_P50_MS and over < TARGET_OVERHEAD_MS
        ok &= met
        lines.append(f"* {norm}: HTTP p50 {p50:.3f} ms ({'met' if p50 < TARGET_P50_MS else 'MISSED'}), "
                     f"overhead {over:.3f} ms ({'met' if over < TARGET_OVERHEAD_MS else 'MISSED'})")
    for norm in norms:
        r = results[norm]
        srv_over = r["server_cpu_single"] - r["inproc_single"].cpu_ms()
        lines.append(
            f"* {norm} single, where the overhead goes (CPU per request): the server "
            f"{fmt(srv_over)} ms beyond the engine (uvicorn, FastAPI, validation, the thread-pool "
            f"hop, JSON), the `httpx` client {fmt(r['single'].cpu_ms())} ms; `http.client` p50 is "
            f"{fmt(r['single'].p(50) - r['stdlib'].p(50))} ms below `httpx` p50"
        )
    mism = sum(results[n]["mismatches"] for n in norms)
    lines.append(f"* HTTP answers whose distance differs from the in-process answer: {mism}")
    text = "\n".join(lines) + "\n"
    print(text)
    if not a.no_write:
        out = Path(a.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
        say(f"wrote {out}")
    return 0 if mism == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
