"""Kernel state a run shares with other runs or the host: one test per class, each an attack run through
SandboxPool as a program would, judged right only where the mechanism that holds it is in place.

What it is: memory parked in netlink queues (charged to no cgroup: the system-call filter refuses the socket),
page-cache residency used as a store between runs and between timing repeats (the filter refuses the calls that
query or evict it), per-user kernel budgets shared by concurrent runs (a uid per root worker), the global OOM
killer's choice (oom_score_adj of runs), and a mode whose runs cannot import the standard library (declared and
refused). What it is not: the isolation layers' other tests (test_sandbox_isolation.py) or the judge.
"""
import ctypes
import json
import os
import random
import subprocess
import sys
import threading
import time

import pytest

import sandbox as sb

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def pool1():
    with sb.SandboxPool(1) as pool:
        yield pool


@pytest.fixture(scope="module")
def pool2():
    with sb.SandboxPool(2) as pool:
        yield pool


def stdio(program, expected="", **kw):
    return sb.Job(program, "stdio", [{"input": "", "output": expected}], **kw)


# --- Kernel memory outside the run's cgroup: netlink queues -------------------------------------------------------
# NETLINK_ROUTE answers a message of an unknown type sent with NLM_F_ACK with an error ack that echoes it; unread,
# the acks stay queued on the socket (up to twice net.core.rmem_max each), charged to no cgroup.
NETLINK_PARK = """import socket, struct
payload = b"x" * 32000
sockets, parked = [], 0
for i in range(40):
    s = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
    for n in range(300):
        s.send(struct.pack("=LHHLL", 16 + len(payload), 0x7FF0, 5, n, 0) + payload)
    sockets.append(s)
for s in sockets:               # read back: the data was really held
    while True:
        try:
            parked += len(s.recv(1 << 20, socket.MSG_DONTWAIT))
        except BlockingIOError:
            break
        except OSError:         # ENOBUFS: acks dropped once the queue was full
            continue
print(parked)
"""


def test_memory_parked_in_netlink_queues_is_refused_or_counted(pool1):
    limit = 64 << 20
    r = pool1.run([stdio(NETLINK_PARK, "0", memory_limit_mb=limit >> 20, time_limit_s=10.0)])[0]
    parked = int(r.stdout.strip() or 0)
    print(f"parked {parked >> 20} MB, peak {r.peak_bytes >> 20} MB: {r.verdict} {r.stderr[-200:]}")
    assert parked <= limit, f"{parked >> 20} MB held past a {limit >> 20} MB limit (peak {r.peak_bytes >> 20} MB)"
    assert parked == 0 or r.peak_bytes >= parked, "the peak under-reports what the run held"


def test_honest_sockets_still_work(pool1):
    program = ("import socket, threading\n"
               "a, b = socket.socketpair()\n"
               "a.sendall(b'x' * 100000)\n"
               "got = b''\n"
               "while len(got) < 100000:\n"
               "    got += b.recv(65536)\n"
               "s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)\n"
               "s6 = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)\n"
               "t = threading.Thread(target=print, args=(len(got),))\n"
               "t.start(); t.join()\n")
    r = pool1.run([stdio(program, "100000")])[0]
    assert r.verdict == "passed", (r.verdict, r.stderr[-500:])


# --- Page-cache residency as a store between runs -----------------------------------------------------------------
# Bit i of a value is whether one page of the largest file of the standard library is cached: set by reading it,
# cleared by posix_fadvise(DONTNEED), read by preadv2(RWF_NOWAIT) (EAGAIN: not cached). The page cache is one per host.
PAGE_CACHE = """import os
TOKEN, BITS = {token}, 24
lib = os.path.dirname(os.__file__)
size, path = max((os.path.getsize(os.path.join(d, f)), os.path.join(d, f)) for d, _, names in os.walk(lib)
                 for f in names if os.path.isfile(os.path.join(d, f)))
step = size // BITS                 # pages far apart: the readahead of one does not reach the next
fd = os.open(path, os.O_RDONLY)


def cached(i):
    try:
        return os.preadv(fd, [bytearray(1)], i * step, os.RWF_NOWAIT) == 1
    except BlockingIOError:
        return False


def read():
    return sum(cached(i) << i for i in range(BITS))


def store(value):
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    for i in range(BITS):
        if value >> i & 1:
            os.pread(fd, 1, i * step)
"""


def _token():
    return random.SystemRandom().randrange(1, (1 << 24) - 1)


def test_a_value_stored_in_page_cache_residency_is_not_read_by_a_later_run(pool1):
    token = _token()
    program = PAGE_CACHE.format(token=token)
    writer = program + "try:\n    store(TOKEN)\nexcept OSError as e:\n    print(e)\n"
    reader = program + "try:\n    print(read())\nexcept OSError as e:\n    print(e)\n"
    wrote = pool1.run([stdio(writer)])[0]
    read = pool1.run([stdio(reader, str(token))])[0]
    print("writer:", wrote.stdout.strip()[:100], "reader:", read.stdout.strip()[:100])
    assert read.verdict != "passed" and read.stdout.strip() != str(token)


def test_a_timing_repeat_does_not_read_what_the_one_before_stored(pool1):
    # Each repeat must print "first": one that finds the token a repeat before it stored prints "second".
    program = PAGE_CACHE.format(token=_token()) + (
        "try:\n"
        "    found = read() == TOKEN\n"
        "    if not found:\n"
        "        store(TOKEN)\n"
        "except OSError:\n"
        "    found = False\n"
        "print('second' if found else 'first')\n")
    r = pool1.run([stdio(program, "first", repeat=3)])[0]
    assert r.verdict == "passed", (r.verdict, r.error, r.stdout)
    assert len(r.cpu_runs) == 3


def test_page_cache_queries_fail_and_plain_reads_work(pool1):
    program = ("import os, mmap\n"
               "fd = os.open(os.__file__, os.O_RDONLY)\n"
               "out = [len(os.pread(fd, 10, 0)), os.preadv(fd, [bytearray(10)], 0)]\n"
               "for call in (lambda: os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED),\n"
               "             lambda: os.preadv(fd, [bytearray(1)], 0, os.RWF_NOWAIT),\n"
               "             lambda: mmap.mmap(fd, 0, prot=mmap.PROT_READ).madvise(21)):\n"
               "    try:\n"
               "        call()\n"
               "        out.append('allowed')\n"
               "    except OSError:\n"
               "        out.append('refused')\n"
               "print(*out)\n")
    r = pool1.run([stdio(program, "10 10 refused refused refused")])[0]
    assert r.verdict == "passed", (r.verdict, r.stdout, r.stderr[-300:])


# --- Per-user kernel budgets: a sibling's pipes keep their default size ---------------------------------------------
# fs.pipe-user-pages-soft is per uid: once a uid's pipes hold that many pages, every new pipe of that uid gets 2 pages.
PIPE_HOG = """import fcntl, os, time
pipes = []
try:
    while True:
        r, w = os.pipe()
        pipes.append((r, w))
        fcntl.fcntl(w, fcntl.F_SETPIPE_SZ, 1 << 20)
except OSError:
    pass
print(len(pipes), fcntl.fcntl(pipes[-1][1], fcntl.F_GETPIPE_SZ))
time.sleep(3)
"""
PIPE_SIBLING = """import fcntl, os, time
time.sleep(1)                   # the hog has spent its budget by now
r, w = os.pipe()
print(fcntl.fcntl(w, fcntl.F_GETPIPE_SZ))
"""


def test_a_siblings_pipes_keep_their_default_size_while_another_run_exhausts_its_budget(pool2):
    if not pool2.mode.get("own_budgets", True):
        assert "per-user budgets" in sb.mode_line(pool2.mode) and sb.refusal(pool2.mode)
        pytest.skip("runs share one uid here (declared and refused)")
    hog, sibling = pool2.run([stdio(PIPE_HOG, "", time_limit_s=4.0), stdio(PIPE_SIBLING, "65536", time_limit_s=4.0)])
    print("hog:", hog.stdout.strip(), "sibling:", sibling.stdout.strip())
    assert hog.stdout.split()[-1:] == ["8192"], "the hog did not exhaust its budget: the test shows nothing"
    assert sibling.verdict == "passed", (sibling.stdout, sibling.stderr[-300:])


def test_concurrent_workers_run_as_different_uids(pool2):
    uids = [w.features["run_as"] for w in pool2._workers]
    if os.geteuid() == 0:
        assert len(set(uids)) == len(uids) and all(u >= sb.RUN_UID_BASE for u in uids), uids


# --- The global OOM killer's choice ---------------------------------------------------------------------------------
def _processes_of(uid):
    found = []
    for p in os.listdir("/proc"):
        try:
            if p.isdigit() and os.stat(f"/proc/{p}").st_uid == uid:
                found.append(int(p))
        except FileNotFoundError:
            pass
    return found


@pytest.mark.skipif(os.geteuid() != 0, reason="finds the run by its uid, which only a root worker changes")
def test_a_runs_oom_score_adj_is_1000(pool1):
    uid = pool1._workers[0].features["run_as"]
    results = []
    client = threading.Thread(target=lambda: results.extend(pool1.run([stdio("import time\ntime.sleep(2)\n")])))
    client.start()
    adjust, deadline = {}, time.monotonic() + 5.0
    while not adjust and time.monotonic() < deadline:
        for pid in _processes_of(uid):
            try:
                with open(f"/proc/{pid}/oom_score_adj") as f:
                    adjust[pid] = int(f.read())
            except (FileNotFoundError, ProcessLookupError):
                pass
        time.sleep(0.05)
    client.join()
    assert adjust and set(adjust.values()) == {1000}, adjust


# --- A mode whose runs cannot import the standard library -----------------------------------------------------------
_libc = ctypes.CDLL(None, use_errno=True)


def _stdlib_unreadable_by_others():
    """preexec: a private mount namespace where the standard library's parent directory is covered by a tmpfs of mode
    700 holding binds of its entries: this process (root) still reads it, another uid cannot reach it."""
    def run():
        if _libc.unshare(0x00020000) != 0:
            raise OSError(ctypes.get_errno(), "unshare mount namespace")
        _libc.mount(None, b"/", None, ctypes.c_ulong(16384 | (1 << 18)), None)          # rprivate
        above = os.path.dirname(os.path.dirname(os.path.realpath(os.__file__)))
        kept = {n: os.open(os.path.join(above, n), os.O_PATH) for n in os.listdir(above)}
        if _libc.mount(b"tmpfs", above.encode(), b"tmpfs", ctypes.c_ulong(0), b"mode=700,size=1m") != 0:
            raise OSError(ctypes.get_errno(), f"cover {above}")
        for name, fd in kept.items():
            entry, source = os.path.join(above, name), f"/proc/self/fd/{fd}"
            os.mkdir(entry) if os.path.isdir(source) else open(entry, "w").close()
            if _libc.mount(source.encode(), entry.encode(), None, ctypes.c_ulong(4096 | 16384), None) != 0:
                raise OSError(ctypes.get_errno(), f"bind {entry}")
    return run


@pytest.mark.skipif(os.geteuid() != 0, reason="makes the standard library unreadable to the run uid (root only)")
@pytest.mark.parametrize("isolation", ["none", "auto"])
def test_a_mode_whose_runs_cannot_import_the_standard_library_says_so_and_is_refused(isolation):
    out = subprocess.run([sys.executable, "-I", os.path.join(ROOT, "sandbox.py"), "--probe", "--isolation",
                          isolation], capture_output=True, text=True, timeout=120,
                         preexec_fn=_stdlib_unreadable_by_others())
    assert out.returncode == 0, out.stderr[-2000:]
    mode = json.loads(out.stdout.rsplit("\n", 2)[0])
    line = out.stdout.splitlines()[-1]
    print(line)
    assert not mode["stdlib"] and "standard library" in line
    refused = sb.refusal(mode, allow_unisolated=True, allow_uncounted=True)
    assert refused and "standard library" in refused
    assert sb.refusal(mode, allow_unisolated=True, allow_uncounted=True, allow_missing_stdlib=True) is None


def test_where_the_standard_library_is_readable_the_mode_says_nothing(pool1):
    assert pool1.mode["stdlib"] and "standard library" not in sb.mode_line(pool1.mode)
    r = pool1.run([stdio("import csv, glob, hashlib, textwrap\nprint(1)\n", "1")])[0]
    assert r.verdict == "passed", r.stderr[-300:]


# --- The filter's own edges ------------------------------------------------------------------------------------------
@pytest.mark.skipif(os.uname().machine != "x86_64", reason="x32 numbers exist on x86_64 only")
def test_a_call_by_another_abis_number_kills_the_run(pool1):
    # getpid by its x32 number: the filter's call numbers are x86_64's, so any other ABI's call is refused outright.
    program = "import ctypes\nctypes.CDLL(None).syscall(0x40000000 | 39)\nprint('alive')\n"
    r = pool1.run([stdio(program, "alive")])[0]
    assert r.verdict != "passed" and "alive" not in r.stdout, (r.verdict, r.stdout)


def test_the_filter_is_declared(pool1):
    if pool1.isolation["seccomp"]:
        assert "system-call filter" not in sb.mode_line(pool1.mode)
    else:
        assert not pool1.mode["isolated"] and "system-call filter" in sb.mode_line(pool1.mode)
