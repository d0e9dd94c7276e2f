# Over 600 lines on purpose: the whole simulated rank (boot checks, rendezvous, boot-log lines) is one process
# entry point; the step model is in model.py, the HTTP API in api.py.
"""The simulated SGLang rank: what `docker run ... dsv41-3x-spark:local run` starts on a testbed host.

It behaves like one TP rank of the real engine at the interfaces sparkfleet uses (docs/reference.md sections 2-4
and 7; docs/simulator.md documents the model):
- reads the real files the roles manage: packed Engram shards in $DSV41_PACKED_DIR (validated like the
  engine does: a present but wrong shard aborts the boot), the checkpoint's index and headers under
  /models, autotune caches under /root/.cache, adapters baked into /opt/dsv41/adapter, /state/api-key;
- reads its container env (NODE_RANK, TP_SIZE, HEAD_IP, DIST_PORT, MEM_FRACTION_STATIC, the DSV41_
  switches...) and the host's /proc/meminfo;
- rendezvous: rank 0 listens on DIST_PORT; the other ranks connect, and a missing rank, a duplicate
  rank or a different TP_SIZE fails the boot on every rank with a clear line; once up, a rank whose
  peer disappears aborts like an NCCL watchdog would;
- writes the boot lines of docs/reference.md (memory calculation, KV pool, graphs, draft runner, Engram, autotune,
  adapter markers, ready) and, on rank 0, serves the OpenAI API (testbed/engine/api.py) paced by the
  step-time model (testbed/engine/model.py).
"""
from __future__ import annotations

import fcntl
import json
import os
import signal
import socket
import struct
import sys
import threading
import time
import traceback

from engine import autotune, netib
from engine.model import SimConfig

MAGIC = 0x31344E4531565344
ROW_BYTES = 264
GIB = 1024 ** 3
ADAPTER_DIR = "/opt/dsv41/adapter"
BYTES_PER_FULL_TOKEN = 1670.75
SWA_FIXED = 0.30 * GIB
# Per-rank bytes the weights, graphs and workspace take inside the static fraction (TP3), chosen so that
# memory fraction 0.95 on a quiet 128 GB node leaves ~1.04 GB for the KV cache as on the real fleet.
RANK_WEIGHTS_BYTES = 123.06e9
DISPLAY_RESERVE_BYTES = 0.35 * GIB      # a running desktop holds GPU memory (headless grows the KV pool)
HEADROOM_BYTES = 1 * GIB                # what the driver and runtime need beyond the static fraction
WO_A_BF16_MIB, WO_A_TWINS_MIB = 1376, 688


class BootError(Exception):
    pass


def log(line: str) -> None:
    """A scheduler line of this rank: ``[date time TP<r> EP<r>]`` (docs/reference.md section 7a; EP_SIZE = TP_SIZE)."""
    if not line.startswith("["):
        rank = os.environ.get("NODE_RANK", "?")
        line = f"[{time.strftime('%Y-%m-%d %H:%M:%S')} TP{rank} EP{rank}] {line}"
    raw(line)


def log_main(line: str) -> None:
    """A line of the main (tokenizer) process: ``[date time]`` only."""
    raw(f"[{time.strftime('%Y-%m-%d %H:%M:%S')}] {line}")


def raw(line: str) -> None:
    """A line of the image's launcher (boot.py, adapters) or a Python warning: no prefix."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def progress_bar(what: str, total: int, seconds: float) -> str:
    """The fragment tqdm leaves before the next log line (CR redraws, then ESC[A): docs/reference.md section 7a."""
    rate = seconds / max(1, total)
    return (f"{what}: 100% Completed | {total}/{total} [{int(seconds) // 60:02d}:{int(seconds) % 60:02d}<00:00, "
            f"{rate:.2f}s/it]\x1b[A")


def launcher_lines(env: dict, tp: int) -> list[str]:
    """What the image's boot.py and adapters print before SGLang starts (docs/reference.md section 7a)."""
    lines = ["DSV41 MXFP8 dense linears routed to FlashInfer backend 'b12x' "
             "(zero block scales of padded shards encoded as 1.0)"]
    if tp & (tp - 1):   # 8 wo_a groups do not split evenly: the pad adapter pads them (TP3: 8 -> 12)
        lines.append(f"DSV41 TP pad installed (tp={tp})")
    if env.get("SKIP_PREPARE", "1") == "1":
        lines.append("SKIP_PREPARE=1 — using existing checkpoint")
    lines.append("/sgl-workspace/sglang/python/sglang/launch_server.py:63: UserWarning: "
                 "'python -m sglang.launch_server' is still supported, but 'sglang serve' is the recommended entrypoint.")
    return lines


def server_args_line(env: dict, rank: int, tp: int, head: str, port: int) -> str:
    """The ``server_args={...}`` line (dict form) with the fields sparkfleet reads."""
    def num(name, default):
        value = env.get(name, "") or default
        try:
            return int(value)
        except ValueError:
            return float(value)
    args = {
        "model_path": env.get("MODEL_PATH", "/models/DeepSeek-V4.1-Flash"),
        "host": "0.0.0.0", "port": num("PORT", "8888"),
        "mem_fraction_static": num("MEM_FRACTION_STATIC", "0.95"),
        "max_running_requests": num("MAX_RUNNING_REQUESTS", "4"),
        "max_total_tokens": num("MAX_TOTAL_TOKENS", "0") or None,
        "chunked_prefill_size": num("CHUNKED_PREFILL_SIZE", "1024"),
        "nnodes": tp, "node_rank": rank, "tp_size": tp,
        "dist_init_addr": f"{head}:{port}",
        "api_key": "[REDACTED]" if os.path.exists("/state/api-key") else None,
        "enable_metrics": "--enable-metrics" in env.get("EXTRA_SGLANG_ARGS", ""),
        "speculative_algorithm": env.get("SPEC_ALGO", "DSPARK"),
        "ep_size": num("EP_SIZE", str(tp)),
    }
    return "server_args=" + repr(args)


def switch_on(env: dict, name: str) -> bool:
    return env.get(name, "").strip().lower() not in ("", "0", "off", "false")


def adapter_present(name: str) -> bool:
    """An adapter can print its markers when its file is in the image's adapter dir and, in an image that carries
    sparkfleet's bundle manifest (roles/adapters), when the manifest lists it with that file's sha256."""
    path = os.path.join(ADAPTER_DIR, name)
    if not os.path.isfile(path):
        return False
    listed = bundle_manifest()
    if listed is None:
        return True                     # an image from before sparkfleet's bundles (the seed image)
    return listed.get(f"adapter/{name}") == _file_sha256(path)


# ---------------------------------------------------------------- sparkfleet's adapter bundle manifest

BUNDLE_MANIFEST = "/opt/dsv41/sparkfleet-bundle.json"


def bundle_manifest() -> dict | None:
    """{bundle path: sha256} from the image's bundle manifest; None without one, {} for an unreadable one."""
    try:
        with open(BUNDLE_MANIFEST) as fh:
            return {e["path"]: e["sha256"] for e in json.load(fh)["files"]}
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError):
        return {}


def _file_sha256(path: str) -> str:
    import hashlib
    with open(path, "rb") as fh:
        return hashlib.sha256(fh.read()).hexdigest()


def meminfo() -> dict:
    out = {}
    with open("/proc/meminfo") as fh:
        for line in fh:
            key, _, rest = line.partition(":")
            parts = rest.split()
            if parts:
                out[key] = int(parts[0]) * (1024 if len(parts) > 1 else 1)
    return out


# ---------------------------------------------------------------- Engram

def read_index(model_dir: str) -> dict:
    path = os.path.join(model_dir, "model.safetensors.index.json")
    try:
        with open(path) as fh:
            return json.load(fh)["weight_map"]
    except (OSError, ValueError, KeyError) as exc:
        raise BootError(f"cannot read the checkpoint index {path}: {exc}")


def engram_rows(model_dir: str, weight_map: dict, layer: int) -> int:
    name = f"layers.{layer}.engram.embed.weight"
    shard = weight_map.get(name)
    if shard is None:
        raise BootError(f"checkpoint has no tensor {name}")
    with open(os.path.join(model_dir, shard), "rb") as fh:
        (size,) = struct.unpack("<Q", fh.read(8))
        header = json.loads(fh.read(size))
    return int(header[name]["shape"][0])


def check_packed(path: str, layer: int, lo: int, hi: int, n: int) -> bool:
    """The engine's load-time check (docs/reference.md section 3); False when absent, BootError when wrong."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        head = os.pread(fd, 48, 0)
        size = os.fstat(fd).st_size
    finally:
        os.close(fd)
    if len(head) < 48:
        raise BootError(f"Engram packed shard {path} is truncated ({size} bytes); re-run the pack step")
    magic, f_layer, f_lo, f_hi, f_n, f_row = struct.unpack("<6Q", head)
    if magic != MAGIC or f_row != ROW_BYTES:
        raise BootError(f"Engram packed shard {path} has a bad header; re-run the pack step")
    if (f_layer, f_lo, f_hi, f_n) != (layer, lo, hi, n):
        raise BootError(f"Engram packed shard {path} (layer={f_layer} rows=[{f_lo},{f_hi}) N={f_n}) does not "
                        f"match this rank's range (layer={layer} rows=[{lo},{hi}) N={n}); re-run the pack step")
    want = 4096 + (hi - lo) * ROW_BYTES
    if size < want:
        raise BootError(f"Engram packed shard {path} is truncated ({size} of {want} bytes); re-run the pack step")
    if size != want:
        raise BootError(f"Engram packed shard {path} has {size} bytes, expected {want}; re-run the pack step")
    return True


def engram_boot(env: dict, rank: int, tp: int) -> tuple[list[str], bool]:
    model_dir = env.get("MODEL_PATH", "/models/DeepSeek-V4.1-Flash")
    packed_dir = env.get("DSV41_PACKED_DIR", "/engram")
    weight_map = read_index(model_dir)
    cache_gib = float(env.get("DSV41_CACHE_GIB", "0") or 0)
    ways = int(env.get("DSV41_CACHE_WAYS", "4") or 4)
    threads = int(env.get("DSV41_IO_THREADS", "96") or 96)
    lines, all_packed = [], True
    for layer in (1, 14):
        n = engram_rows(model_dir, weight_map, layer)
        lo, hi = n * rank // tp, n * (rank + 1) // tp
        packed = check_packed(os.path.join(packed_dir, f"engram-l{layer}-r{rank}of{tp}.bin"), layer, lo, hi, n)
        all_packed &= packed
        slots = int(cache_gib * GIB // (ROW_BYTES * ways)) * ways if cache_gib else 0
        pct = min(100.0, 100.0 * slots / max(1, hi - lo))
        lines.append(f"Exact nvme Engram layer={layer} rank={rank} rows=[{lo},{hi}) cache={cache_gib:.1f}GiB "
                     f"({slots} slots, {ways}-way, {pct:.1f}% of owned rows) scales={(hi - lo) * 8 / GIB:.1f}GiB "
                     f"io_threads={threads} packed={packed}")
    return lines, all_packed


# ---------------------------------------------------------------- contention (what the GPU feels)

DESKTOP_PID = "/.testbed/desktop.pid"   # the host's /run/testbed/desktop.pid (fake_gdm.py), bound by the GPU hook


def desktop_active() -> bool:
    """fake_gdm.py holds a lock on its pid file while it runs. A lock, not kill(pid, 0): the rank runs in its
    container's PID namespace, where the host's pid does not exist; the lock goes with the process (SIGKILL too)."""
    try:
        with open(DESKTOP_PID) as fh:
            try:
                fcntl.flock(fh, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
            fcntl.flock(fh, fcntl.LOCK_UN)
            return False
    except OSError:
        return False


# The host's Docker API socket, bound here by the testbed's GPU hook (testbed/standins/
# nvidia_container_runtime_hook.py): the testbed's way for the model of GPU contention to know what else runs
# on the node. The real hook binds no such thing and no role reads it. SIM_ENGINE_SOCK overrides it (tests).
ENGINE_SOCK = "/.testbed-engine.sock"
ENGINE_TIMEOUT_S = 2.0
CONTAINER_MS = 0.15     # per step, for each running, not-paused, non-serving container on the rank's host


def engine_containers(path: str | None = None, timeout_s: float = ENGINE_TIMEOUT_S) -> list:
    """The host engine's running and paused containers (Engine API `GET /containers/json`), over the bound
    AF_UNIX socket with a plain HTTP/1.0 request; [] on any error (no socket, no answer, not 200, bad JSON)."""
    path = path or os.environ.get("SIM_ENGINE_SOCK") or ENGINE_SOCK
    deadline = time.monotonic() + timeout_s
    chunks = []
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout_s)
            sock.connect(path)
            sock.sendall(b"GET /containers/json HTTP/1.0\r\nHost: docker\r\n\r\n")
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    return []
                sock.settimeout(left)
                chunk = sock.recv(65536)
                if not chunk:
                    break
                chunks.append(chunk)
        head, _, body = b"".join(chunks).partition(b"\r\n\r\n")
        status = head.split(b"\r\n", 1)[0].split()
        if len(status) < 2 or status[1] != b"200":
            return []
        listed = json.loads(body)
    except (OSError, ValueError):
        return []
    return listed if isinstance(listed, list) else []


def busy_containers(listed: list) -> int:
    """Running (not paused, not exited) containers that are not the fleet's serving ones (names /dsv41-*)."""
    busy = 0
    for entry in listed:
        if not isinstance(entry, dict) or entry.get("State") != "running":
            continue
        names = entry.get("Names") or []
        if any(isinstance(n, str) and n.startswith("/dsv41-") for n in names):
            continue
        busy += 1
    return busy


def contention_ms() -> tuple[float, int]:
    """Extra per-step milliseconds from this host's background load, and the nvidia-smi poll interval.
    Read once per boot (run()): a container paused or started later counts from the next boot."""
    extra = 1.5 if desktop_active() else 0.0
    extra += CONTAINER_MS * busy_containers(engine_containers())
    poll_ms = 0
    try:
        stamps = [float(line.split()[0]) for line in open("/.testbed/nvidia-smi.log") if "--query-gpu" in line]
        recent = [s for s in stamps if s > time.time() - 60]
        if len(recent) >= 3:
            poll_ms = int(1000 * (recent[-1] - recent[0]) / (len(recent) - 1))
    except (OSError, ValueError, IndexError):
        pass
    try:
        gpu = json.load(open("/.testbed/gpu.json"))
        if gpu.get("locked") and gpu["locked"][1] < 2600:
            extra += 1.0   # the SM clock cap costs ~1% of a ~98 ms step (docs/reference.md section 6)
    except (OSError, ValueError):
        pass
    return extra, poll_ms


# ---------------------------------------------------------------- rendezvous

def _send(sock: socket.socket, obj: dict) -> None:
    sock.sendall((json.dumps(obj) + "\n").encode())


def _recv(reader) -> dict | None:
    line = reader.readline()
    return json.loads(line) if line else None


def _fail_rendezvous(peers: dict, error: str) -> None:
    """Tell every connected peer why the rendezvous failed, then fail this rank's boot."""
    for conn, _, _ in peers.values():
        if conn:
            try:
                _send(conn, {"ok": False, "error": error})
            except OSError:
                pass
    raise BootError(f"Rendezvous failed: {error}")


def rendezvous_head(info: dict, tp: int, port: int, timeout: float) -> tuple[dict, list]:
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("0.0.0.0", port))
    server.listen(16)
    server.settimeout(0.5)
    peers: dict[int, tuple] = {0: (None, None, info)}
    deadline = time.monotonic() + timeout
    error = None
    while len(peers) < tp and time.monotonic() < deadline and error is None:
        try:
            conn, addr = server.accept()
        except socket.timeout:
            continue
        conn.settimeout(10)
        reader = conn.makefile("r")
        hello = _recv(reader)
        if hello is None:
            conn.close()
            continue
        r = hello.get("rank")
        if hello.get("tp") != tp:
            error = f"rank {r} at {addr[0]} reports TP_SIZE={hello.get('tp')}, rank 0 expects {tp}"
        elif not isinstance(r, int) or not 0 < r < tp:
            error = f"a peer at {addr[0]} reports rank {r}, outside 1..{tp - 1}"
        elif r in peers:
            error = f"rank {r} joined twice (from {addr[0]})"
        peers[r if error is None else -len(peers) - 100] = (conn, reader, hello)
    if error is None and len(peers) < tp:
        missing = sorted(set(range(tp)) - set(peers))
        error = f"timed out after {timeout:.0f} s waiting for rank(s) {missing} at port {port}"
    if error:
        _fail_rendezvous(peers, error)
    infos = {r: p[2] for r, p in peers.items()}
    # NCCL connects every rank's queue pairs: a rank whose GID cannot carry them fails the whole init.
    broken = [(r, i) for r, i in sorted(infos.items()) if not (i.get("nccl") or {"ok": True})["ok"]]
    if broken:
        _fail_rendezvous(peers, "NCCL init failed: " + "; ".join(
            f"rank {r} ({i.get('host')}) {i['nccl']['error']}" for r, i in broken))
    decision = autotune_decision(infos, tp)
    for r, (conn, _, _) in peers.items():
        if conn:
            _send(conn, {"ok": True, "decision": decision, "ranks": {str(k): v for k, v in infos.items()}})
            conn.settimeout(None)   # from now on the link only carries liveness: block until it ends
    server.close()
    return decision, [(r, p[0], p[1]) for r, p in peers.items() if p[0]], infos


def rendezvous_worker(info: dict, head: str, port: int, timeout: float) -> tuple[dict, socket.socket, object]:
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        try:
            sock = socket.create_connection((head, port), timeout=2)
            break
        except OSError as exc:
            last = str(exc)
            time.sleep(0.2)
    else:
        raise BootError(f"Rendezvous failed: rank 0 at {head}:{port} did not answer within {timeout:.0f} s ({last})")
    _send(sock, info)
    sock.settimeout(timeout + 30)
    reader = sock.makefile("r")
    reply = _recv(reader)
    if reply is None:
        raise BootError(f"Rendezvous failed: rank 0 at {head}:{port} closed the connection")
    if not reply.get("ok"):
        raise BootError(f"Rendezvous failed: {reply.get('error')}")
    sock.settimeout(None)
    return reply, sock, reader


def watch_peers(peers: list, what: str) -> None:
    """Abort the process when a peer disappears, as an NCCL watchdog would."""
    def watch(rank, reader):
        try:
            while reader.readline():
                pass
        except OSError:
            pass
        log(f"[NCCL] Watchdog caught collective operation timeout: {what} rank {rank} is gone; aborting")
        os._exit(1)
    for rank, _, reader in peers:
        threading.Thread(target=watch, args=(rank, reader), daemon=True).start()


# ---------------------------------------------------------------- autotune

def autotune_info(env: dict, rank: int, tp: int) -> dict:
    keep = switch_on(env, "DSV41_AUTOTUNE_KEEP") and adapter_present("autotune_keep.py")
    argv = sys.argv[1:]
    fingerprint = autotune.env_fingerprint(env, argv)
    # The stock digest covers the whole container env, rank-specific keys included: that is why the
    # real fleet's ranks disagree at every boot.
    stock_env = json.dumps(sorted(env.items()))
    kinds = {}
    for kind in ("target", "draft"):
        path = autotune.cache_path("/root/.cache", rank, tp, kind)
        digest = autotune.file_digest(path)
        sidecar = path[:-5] + ".launch"
        try:
            sidecar_ok = open(sidecar).read().strip() == fingerprint
        except OSError:
            sidecar_ok = False
        kinds[kind] = {"path": path, "present": digest is not None, "sidecar_ok": sidecar_ok,
                       "stock_digest": None if digest is None else autotune.hashlib.sha256(
                           (digest + stock_env).encode()).hexdigest()}
    return {"keep": keep, "fingerprint": fingerprint, "kinds": kinds}


def autotune_decision(infos: dict, tp: int) -> dict:
    boot_id = f"{time.time():.6f}"
    decision = {"boot_id": boot_id}
    for kind in ("target", "draft"):
        entries = [infos[r]["autotune"]["kinds"][kind] for r in sorted(infos)]
        keep = all(infos[r]["autotune"]["keep"] for r in infos)
        if keep:
            action = "reuse" if all(e["present"] and e["sidecar_ok"] for e in entries) else "tune"
        elif not any(e["present"] for e in entries):
            action = "tune"
        elif len({e["stock_digest"] for e in entries}) == 1:
            action = "reuse"
        else:
            action = "disagree"
        decision[kind] = action
    decision["keep"] = all(infos[r]["autotune"]["keep"] for r in infos)
    return decision


def apply_autotune(decision: dict, info: dict, env: dict) -> list[str]:
    # SIM_AUTOTUNE_S: simulated seconds one kind's tuning takes (0 by default; ~36 min after a topology change).
    tune_s = float(env.get("SIM_AUTOTUNE_S", "0") or 0) * float(env.get("SIM_TIME_SCALE", "1.0") or 1.0)
    lines = []
    if info["keep"]:
        lines.append("[autotune_keep] armed")
    for kind in ("target", "draft"):
        entry = info["kinds"][kind]
        path = entry["path"]
        action = decision[kind]
        keydir, name = os.path.dirname(path), os.path.basename(path)
        if action == "reuse":
            lines.append(f"[autotune_keep] reused {keydir}/{name}" if info["keep"]
                         else f"FlashInfer autotune: loaded cache {path}")
            continue
        if action == "disagree":
            lines.append("FlashInfer autotune: per-rank caches disagree, discarding them and tuning from "
                         "scratch so all ranks agree on the tactics.")
        for stale in (path, path[:-5] + ".launch"):
            try:
                os.unlink(stale)
            except FileNotFoundError:
                pass
        lines.append(f"Running FlashInfer autotune with cache: {path}")
        if tune_s:
            for line in lines:       # the retune is visible while it runs (the play's readiness wait reads it)
                log(line)
            lines = []
            time.sleep(tune_s)
        os.makedirs(keydir, exist_ok=True)
        tmp = path + ".tmp"
        with open(tmp, "w") as fh:
            json.dump(autotune.tactics(kind, decision["boot_id"]), fh, indent=1)
        os.replace(tmp, path)
        if info["keep"]:
            with open(path[:-5] + ".launch", "w") as fh:
                fh.write(info["fingerprint"] + "\n")
            lines.append(f"[autotune_keep] tuned and saved {keydir}/{name}")
        lines.append("FlashInfer autotune completed.")
    return lines


# ---------------------------------------------------------------- memory and markers

def wo_a_state(env: dict) -> tuple[str, list[str], float]:
    """wo_a path, its markers and its memory delta in bytes against the bf16 baseline."""
    if not (switch_on(env, "DSV41_WO_A_W8") and adapter_present("wo_a_w8.py")):
        return "einsum", [], 0.0
    tp = int(env.get("TP_SIZE", "3"))
    groups = 4 if tp == 3 else 2
    weights = 43 * groups
    lines = [f"[wo_a_w8] fp8 twins for {weights} wo_a weights, 0 left on bf16"]
    path = "w8"
    delta = WO_A_TWINS_MIB * 2 ** 20
    if switch_on(env, "DSV41_WO_A_MID"):
        lines.append("[wo_a_w8] mid path armed: 9..192 rows from the fp8 twin")
        path = "w8_mid"
    if switch_on(env, "DSV41_WO_A_DROP"):
        lines.append(f"[wo_a_w8] released the bf16 copy of {weights} wo_a weights ({WO_A_BF16_MIB * 1.048576:.0f} MB); "
                     "twins only from now on")
        delta -= WO_A_BF16_MIB * 2 ** 20
    return path, lines, delta


def adapter_markers(env: dict) -> tuple[list[str], float]:
    lines, delta = [], 0.0
    simple = [("DSV41_FOLDED_FENCE", "folded_fence.py", "[folded_fence] armed: folded results fenced before verify"),
              ("DSV41_BLOCK_VERIFY", "block_verify.py", "[block_verify] armed"),
              ("DSV41_ENGRAM_PREFETCH", "engram_prefetch.py", "Engram prefetch ARMED")]
    for gate, filename, marker in simple:
        if switch_on(env, gate) and adapter_present(filename):
            lines.append(marker)
    if switch_on(env, "DSV41_ENGRAM_PREFETCH") and switch_on(env, "DSV41_ENGRAM_PREFETCH_CHECK") \
            and adapter_present("engram_prefetch.py"):
        lines.append("Engram prefetch CHECK on: re-running the synchronous path; timings are not valid")
    if switch_on(env, "DSV41_VERIFY_CAP") and adapter_present("verify_cap.py"):
        lines.append(f"[verify_cap] armed: {env['DSV41_VERIFY_CAP']}")
    if switch_on(env, "DSV41_DRAFT_HEAD_FP8") and adapter_present("draft_head_fp8.py"):
        lines.append("[draft_head_fp8] draft lm_head in fp8 (saved 742 MB)")
        delta -= 742e6
    if "DSV41_DRAFT_TAU" in env:
        if env.get("SGLANG_DSPARK_FOLDED_SAMPLING") == "2":
            lines.append(f"DSpark draft temperature tau={env['DSV41_DRAFT_TAU'] or 'AUTO'} (folded sampling 2)")
        else:
            lines.append("DSpark draft temperature ignored: needs SGLANG_DSPARK_FOLDED_SAMPLING=2")
    return lines, delta


def kv_capacity(env: dict, mem: dict, desktop: bool, extra_bytes: float) -> dict:
    total = mem["MemTotal"]
    available = mem["MemAvailable"]
    fraction = float(env.get("MEM_FRACTION_STATIC", "0.95"))
    static = fraction * total
    if static + HEADROOM_BYTES > available:
        raise BootError(
            f"CUDA error: out of memory (NV_ERR_NO_MEMORY) while reserving the static pool: mem_fraction_static="
            f"{fraction} asks for {static / GIB:.2f} GiB of {total / GIB:.2f} GiB, MemAvailable is "
            f"{available / GIB:.2f} GiB (needs {HEADROOM_BYTES / GIB:.0f} GiB headroom)")
    avail = static - RANK_WEIGHTS_BYTES - extra_bytes - (DISPLAY_RESERVE_BYTES if desktop else 0)
    if avail <= SWA_FIXED:
        raise BootError(f"Not enough memory for the KV cache: available_bytes={avail / GIB:.2f} GB; "
                        "raise mem_fraction_static or free memory")
    full = int((avail - SWA_FIXED) / BYTES_PER_FULL_TOKEN)
    return {"available": avail, "full_token": full}


# ---------------------------------------------------------------- main

def run() -> int:
    env = dict(os.environ)
    rank = int(env.get("NODE_RANK", "0"))
    tp = int(env.get("TP_SIZE", "3"))
    head = env.get("HEAD_IP", "127.0.0.1")
    port = int(env.get("DIST_PORT", "20000"))
    scale = float(env.get("SIM_TIME_SCALE", "1.0"))
    timeout = float(env.get("SIM_RENDEZVOUS_TIMEOUT_S", "90"))
    started = time.monotonic()
    for line in launcher_lines(env, tp):
        raw(line)
    log_main("Hybrid SWA model detected. architectures=['DeepseekV4ForCausalLM']")
    log_main(server_args_line(env, rank, tp, head, port))
    log("Init torch distributed begin.")
    mem = meminfo()
    wo_a_path, wo_a_lines, wo_a_bytes = wo_a_state(env)
    markers, marker_bytes = adapter_markers(env)
    extra, poll_ms = contention_ms()
    desktop = desktop_active()
    static = float(env.get("MEM_FRACTION_STATIC", "0.95")) * mem["MemTotal"]
    log(f"Load weight begin. avail mem={min(static, mem['MemAvailable']) / GIB:.2f} GB")
    capacity = kv_capacity(env, mem, desktop, wo_a_bytes + marker_bytes)
    phases = boot_phases(env, scale)
    time.sleep(phases["load"])   # weight loading (compressed unless SIM_BOOT_S asks for the real fleet's length)
    engram_lines, packed = engram_boot(env, rank, tp)
    for line in engram_lines:
        log(line)
    load_s = phases["load"]
    # The weights take what the static pool holds beyond the KV budget; the draft is ~2.8 GB of it.
    draft_bytes = 2.80 * GIB
    target_bytes = max(0.0, RANK_WEIGHTS_BYTES - draft_bytes)
    after_target = static - target_bytes
    raw(progress_bar("Loading safetensors checkpoint shards", 48, load_s)
        + _prefixed(f"Load weight end. elapsed={load_s:.2f} s, type=DeepseekV4ForCausalLM, quant=fp8, "
                    f"avail mem={after_target / GIB:.2f} GB, mem usage={target_bytes / GIB:.2f} GB."))
    log(f"Load weight begin. avail mem={after_target / GIB:.2f} GB")
    log(f"Load weight end. elapsed={0.05 * scale:.2f} s, type=DeepseekV4ForCausalLMDSpark, quant=fp8, "
        f"avail mem={(after_target - draft_bytes) / GIB:.2f} GB, mem usage={draft_bytes / GIB:.2f} GB.")
    nccl = netib.setup(env, netib.oob_address(head, port), env.get("SIM_IB_ROOT", "/sys/class/infiniband"))
    for line in nccl["lines"]:
        log(line)
    info = {"rank": rank, "tp": tp, "host": socket.gethostname(), "packed": packed, "contention_ms": extra,
            "gpu_poll_ms": poll_ms, "full_token": capacity["full_token"],
            "autotune": autotune_info(env, rank, tp),
            "nccl": {"ok": nccl["ok"], "error": nccl["error"], "gid_index": nccl["gid_index"]}}
    if rank == 0:
        decision, peers, infos = rendezvous_head(info, tp, port, timeout)
        watch_peers(peers, "worker")
    else:
        reply, sock, reader = rendezvous_worker(info, head, port, timeout)
        decision = reply["decision"]
        infos = {int(r): v for r, v in reply["ranks"].items()}
        watch_peers([(0, sock, reader)], "head")
    fleet = [infos[r] for r in sorted(infos)]
    for line in wo_a_lines + markers:
        log(line)
    block = int(env.get("DSPARK_BLOCK_SIZE", "3") or 3)
    slots = int(env.get("MAX_RUNNING_REQUESTS", "4") or 4)
    avail = capacity["available"]
    log(f"Initialized DSpark draft runner. attention_backend=dsv4, model=DeepseekV4ForCausalLMDSpark, "
        f"gamma={block}, verify_num_draft_tokens={block + 1}")
    log(f"DSV4 memory calculation: bytes_per_full_token={BYTES_PER_FULL_TOKEN}, available_bytes={avail / GIB:.2f} GB, "
        f"c128_state_fixed=0.00 GB, swa_fixed={SWA_FIXED / GIB:.2f} GB, full_token={capacity['full_token']}")
    # The pool is the same on every rank: the smallest rank's capacity, clamped by the pin.
    capacity_tokens = min(r["full_token"] for r in fleet)
    pin = int(env.get("MAX_TOTAL_TOKENS", "0") or 0)
    tokens = capacity_tokens if not pin else min(pin, capacity_tokens)
    tokens = tokens // 256 * 256
    log(pool_sizes_line(capacity["full_token"]))
    log(pool_sizes_line(tokens))          # capped (by the pin, the smallest rank): this is the pool
    log(f"Memory pool end. avail mem={avail / GIB:.2f} GB")
    for line in apply_autotune(decision, info["autotune"], env):
        log(line)
    chunk = int(env.get("CHUNKED_PREFILL_SIZE", "1024") or 1024)
    log(f"Capture target verify CUDA graph begin. backend=full, num_tokens_per_req={block + 1}, "
        f"bs={list(range(1, slots + 1))}, avail mem={avail / GIB:.2f} GB")
    time.sleep(phases["graphs"])
    log(f"Capture target verify CUDA graph end. elapsed={phases['graphs']:.2f} s, mem usage=0.41 GB, "
        f"avail mem={avail / GIB - 0.41:.2f} GB.")
    if rank != 0:
        log(f"Dummy health check server started in background thread at 0.0.0.0:{env.get('PORT', '8888')}")
        with open("/tmp/sim-ready", "w") as fh:
            fh.write("ready\n")
        while True:
            time.sleep(3600)
    log(f"max_total_num_tokens={tokens}, chunked_prefill_size={chunk}, max_prefill_tokens=16384, "
        f"max_running_requests={slots}, context_len=1048576, available_gpu_mem={avail / GIB - 0.12:.2f} GB")
    elapsed = time.monotonic() - started
    log_main(f"Engine startup timings (s): load_weight={load_s + 0.05 * scale:.2f}, kv_cache_allocation=0.01, "
             f"scheduler_e2e={elapsed:.2f}, cuda_graph={{prefill=0.00, decode=0.00, target_verify={phases['graphs']:.2f}, "
             f"draft_decode=0.00}}, tokenizer_e2e={elapsed + 0.01:.2f}")
    return serve_head(env, fleet, wo_a_path, block, slots, scale, phases["warmup"])


def boot_phases(env: dict, scale: float) -> dict:
    """Seconds of a boot's three slow phases: the weight load, the CUDA graph captures, the warm-up.

    Compressed by default (0.3, 0.2 and 0.1 simulated seconds, times SIM_TIME_SCALE: a boot takes a couple of
    seconds). SIM_BOOT_S, a calibration knob the testbed's inventory sets (engine_env), gives a boot the real
    fleet's length instead (docs/reference.md section 10: 3-6 minutes, of which the weight load ~200 s):
    80 % weight load, 10 % graphs, 10 % warm-up (SIM_BOOT_S=240: 192 s, 24 s, 24 s), whatever the time scale,
    so that a campaign on the testbed can be timed with real boots (docs/campaign.md)."""
    boot = float(env.get("SIM_BOOT_S", "0") or 0)
    if boot > 0:
        return {"load": 0.8 * boot, "graphs": 0.1 * boot, "warmup": 0.1 * boot}
    return {"load": 0.3 * scale, "graphs": 0.2 * scale, "warmup": 0.0}


def _prefixed(line: str) -> str:
    rank = os.environ.get("NODE_RANK", "?")
    return f"[{time.strftime('%Y-%m-%d %H:%M:%S')} TP{rank} EP{rank}] {line}"


def pool_sizes_line(full: int) -> str:
    """``DSV4 pool sizes``: the other pools scale with the full-token pool (ratios of docs/reference.md section 7a)."""
    return (f"DSV4 pool sizes: full={full}, swa=13312, c4={full // 4}, c128={full // 128}, c4_state=1664, "
            f"c128_state=0")


def serve_head(env: dict, fleet: list, wo_a_path: str, block: int, slots: int, scale: float, warmup_s: float = 0.0) -> int:
    from engine import api
    api_key = None
    try:
        api_key = open("/state/api-key").read().strip() or None
    except OSError:
        pass
    config = SimConfig(
        tp=len(fleet), engram_packed=[r["packed"] for r in fleet], contention_ms=[r["contention_ms"] for r in fleet],
        gpu_poll_ms=[r["gpu_poll_ms"] for r in fleet], wo_a_path=wo_a_path, dspark_block_size=block, max_running_requests=slots,
        engram_prefetch=switch_on(env, "DSV41_ENGRAM_PREFETCH") and adapter_present("engram_prefetch.py"),
        prefetch_check=switch_on(env, "DSV41_ENGRAM_PREFETCH_CHECK"),
        verify_cap=env.get("DSV41_VERIFY_CAP") if adapter_present("verify_cap.py") else None,
        flags={k: v for k, v in env.items() if k.startswith(("DSV41_", "SGLANG_"))},
        time_scale=scale, enable_metrics="--enable-metrics" in env.get("EXTRA_SGLANG_ARGS", ""),
        api_key=api_key, faults=json.loads(env.get("SIM_FAULTS", "{}") or "{}"))
    port = int(env.get("PORT", "8888"))
    ready = threading.Event()
    server = api.serve(config, "0.0.0.0", port, log, ready)
    log_main("The server is fired up and ready to roll!")
    ready.set()
    answer = self_test(port, api_key)
    if answer != "42":
        raise BootError(f"Fresh inference failed: 19 + 23 answered {answer!r}")
    raw("Fresh inference passed: 19 + 23 = 42")
    raw(f"Batch output sanity check passed: batch of {slots} returned Latin prose.")
    time.sleep(warmup_s)
    raw(f"Warm-up done in {max(1, round(warmup_s or 0.1 * scale))}s (4 prompt sizes + one batch of {slots})")
    key_note = "Key is in /state/api-key." if api_key else "no API key."
    sep = ". " if api_key else ", "
    raw(f"Ready: API on port {port} (rank 0){sep}{key_note}")
    try:
        while True:
            time.sleep(3600)
    finally:
        server.shutdown()


def self_test(port: int, api_key: str | None) -> str:
    import http.client
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    body = json.dumps({"model": "DeepSeek-V4.1-Flash", "temperature": 0, "max_tokens": 8,
                       "messages": [{"role": "user", "content": "What is 19 + 23? Reply only with the number."}],
                       "chat_template_kwargs": {"thinking": False}})
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    conn.request("POST", "/v1/chat/completions", body, headers)
    reply = json.loads(conn.getresponse().read())
    return reply["choices"][0]["message"]["content"].strip()


def health() -> int:
    if os.environ.get("NODE_RANK", "0") != "0":
        return 0 if os.path.exists("/tmp/sim-ready") else 1
    import http.client
    try:
        conn = http.client.HTTPConnection("127.0.0.1", int(os.environ.get("PORT", "8888")), timeout=5)
        conn.request("GET", "/health")
        return 0 if conn.getresponse().status == 200 else 1
    except OSError:
        return 1


def stop_on_sigterm() -> None:
    """`docker stop` sends SIGTERM: a serving rank shuts down at once, as SGLang's server does. Without a handler
    the kernel drops SIGTERM for a container's PID 1, so every stop waited out its timeout and ended in SIGKILL."""
    def stop(signum, frame):
        log("Received SIGTERM: shutting down")
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    signal.signal(signal.SIGTERM, stop)


def main(argv: list[str]) -> int:
    command = argv[0] if argv else "run"
    if command == "health":
        return health()
    if command != "run":
        print(f"usage: boot.py run|health (got {command!r})", file=sys.stderr)
        return 2
    stop_on_sigterm()
    try:
        return run()
    except BootError as exc:
        log(f"RuntimeError: {exc}")
        traceback_lines = ["Traceback (most recent call last):",
                           '  File "/opt/dsv41/boot.py", line 42, in <module>',
                           f"RuntimeError: {exc}"]
        for line in traceback_lines:
            log(line)
        return 1
    except Exception:
        for line in traceback.format_exc().splitlines():
            log(line)
        return 1
