"""Distributed programs on 2 and 3 ranks of the ring backend, on loopback:
collectives and send/recv in JSON programs, inside ``while`` bodies and
across segments; mismatched programs fail on every rank at compile."""

from __future__ import annotations

import textwrap

import pytest

from distributed_helpers import run_ranks


# Each rank builds its program, round-trips it through JSON and checks the
# results against numpy; it prints OK when everything matched.
PRELUDE = textwrap.dedent("""
    import sys
    import numpy as np
    import mlx.core as mx
    import mlxprog as mp

    group = mx.distributed.init()
    r, n = group.rank(), group.size()

    def from_json(builder, outputs):
        return mp.Program.loads(builder.build(outputs).to_json())

    def compile_or_exit(program):
        # The ProgramError's text on stdout and exit status 3, or "compiled".
        try:
            mp.compile(program)
        except mp.ProgramError as exc:
            print("ERROR", exc)
            sys.exit(3)
        print("compiled")

    def check(name, got, want):
        got = np.array(got)
        if got.shape != np.shape(want) or not np.allclose(got, want):
            print(f"MISMATCH {name}: {got.tolist()} != {np.asarray(want).tolist()}")
            sys.exit(1)
""")


def _assert_ok(results) -> None:
    for res in results:
        assert res.returncode == 0 and "OK" in res.stdout, (
            f"rank {res.rank} exited {res.returncode}:\n{res.stdout}\n{res.stderr[-3000:]}")


COLLECTIVES = PRELUDE + textwrap.dedent("""
    x_all = [np.arange(12, dtype=np.float32).reshape(3, 4) * (k + 1) for k in range(n)]
    x = x_all[r]
    b = mp.ProgramBuilder("collectives", world_size=n)
    xi = b.input("x", [3, 4])
    # Ring shift: send to the next rank, receive from the previous one; the
    # send's result is used by nothing (the runtime keeps it).
    b.send(xi, dst=(r + 1) % n)
    got = b.recv(shape=[3, 4], dtype="float32", src=(r - 1) % n)
    outs = [b.all_sum(xi), b.all_max(xi), b.all_min(xi), b.all_gather(xi, axis=1),
            b.all_gather(xi), b.sum_scatter(xi, axis=1) if 4 % n == 0 else b.all_sum(xi),
            got, b.rank(), b.world_size()]
    exe = mp.compile(from_json(b, outs))
    assert (exe.rank, exe.world_size) == (r, n) and exe.group is not None
    for call in range(2):  # the second call replays the trace
        res = exe(x)
        total = sum(x_all)
        check("all_sum", res[0], total)
        check("all_max", res[1], np.max(x_all, axis=0))
        check("all_min", res[2], np.min(x_all, axis=0))
        check("all_gather axis 1", res[3], np.concatenate(x_all, axis=1))
        check("all_gather axis 0", res[4], np.concatenate(x_all, axis=0))
        if 4 % n == 0:
            part = 4 // n
            check("sum_scatter", res[5], total[:, r * part:(r + 1) * part])
        check("recv", res[6], x_all[(r - 1) % n])
        check("rank", res[7], r)
        check("world_size", res[8], n)

    # A program built for another world size fails at compile, on each rank alone.
    b = mp.ProgramBuilder("other size", world_size=n + 1)
    p = b.build([b.all_sum(b.input("x", [2]))])
    try:
        mp.compile(p)
    except mp.ProgramError as exc:
        assert f"built for world size {n + 1}; the group has {n} rank(s)" in str(exc), exc
    else:
        sys.exit("compiling for the wrong world size passed")
    print("OK")
""")


@pytest.mark.parametrize("n", [2, 3])
def test_collectives_and_ring_shift(n):
    _assert_ok(run_ranks(COLLECTIVES, n))


LOOP = PRELUDE + textwrap.dedent("""
    # A while loop whose body all-sums the carry and passes it round the ring,
    # then ops after the loop (another segment) gather the result.
    b = mp.ProgramBuilder("loop", world_size=n)
    x = b.input("x", [2, 2])
    i0 = b.constant(0, "int32")

    def cond(sb, i, v):
        return sb.less(i, sb.constant(3, "int32"))

    def body(sb, i, v):
        s = sb.all_sum(v)
        sb.send(s, dst=(r + 1) % n)
        got = sb.recv(shape=[2, 2], dtype="float32", src=(r - 1) % n)
        return sb.add(i, sb.constant(1, "int32")), sb.add(got, sb.multiply(sb.rank(), sb.constant(0.0)))

    _, v = b.while_loop(cond, body, [i0, x])
    before = b.all_sum(x)  # a segment before the loop
    out = b.all_gather(v, axis=0)
    # MLX alone would evaluate the recv before the all_sum and send on every
    # rank, and wait forever: the runtime keeps program order.
    for eager in (False, True):
        exe = mp.compile(from_json(b, [before, out]), eager=eager)
        x_all = [np.full((2, 2), k + 1, np.float32) for k in range(n)]
        res = exe(x_all[r])
        # Each iteration multiplies every rank's value by n (the sum of equal values).
        want = sum(x_all) * n ** 2
        check("before", res[0], sum(x_all))
        check(f"loop (eager={eager})", res[1], np.concatenate([want] * n, axis=0))

    # A body with only a collective is fused with its condition: one compiled call.
    b = mp.ProgramBuilder("fused loop", world_size=n)
    x = b.input("x", [2, 2])

    def body2(sb, i, v):
        return sb.add(i, sb.constant(1, "int32")), sb.all_sum(v)

    _, v = b.while_loop(cond, body2, [b.constant(0, "int32"), x])
    exe = mp.compile(from_json(b, [v]))
    check("fused loop", exe(np.ones((2, 2), np.float32))[0], np.full((2, 2), n ** 3))

    # Its loops are bounded by the count alone: a clock could stop the ranks at
    # different iterations, where their collectives would wait for each other.
    exe = mp.compile(from_json(b, [v]), limits=mp.Limits(max_loop_seconds=1e-9))
    check("loop past the time limit", exe(np.ones((2, 2), np.float32))[0],
          np.full((2, 2), n ** 3))
    print("OK")
""")


def test_collectives_in_while_bodies_and_across_segments():
    _assert_ok(run_ranks(LOOP, 2))


MISMATCH = PRELUDE + textwrap.dedent("""
    b = mp.ProgramBuilder("mismatch", world_size=n)
    x = b.input("x", [4 if r == 0 else 6])
    p = b.build([b.all_sum(x)])
    compile_or_exit(p)
""")


def test_mismatched_programs_fail_on_every_rank():
    results = run_ranks(MISMATCH, 2, timeout=30)
    for res in results:
        assert res.returncode == 3, (res.rank, res.returncode, res.stdout, res.stderr)
        assert "rank(s) 1 compiled a program whose collectives differ from rank 0's" \
            in res.stdout
        assert "Traceback" not in res.stderr


EARLY_FAILURE = PRELUDE + textwrap.dedent("""
    # Rank 1's program is built for another world size: it fails before the
    # ranks compare digests, and rank 0, waiting for it there, fails too.
    b = mp.ProgramBuilder("early", world_size=n if r == 0 else n + 1)
    p = b.build([b.all_sum(b.input("x", [4]))])
    compile_or_exit(p)
""")


def test_a_rank_failing_before_the_digest_exchange_fails_the_others():
    results = run_ranks(EARLY_FAILURE, 2, timeout=30)
    assert [res.returncode for res in results] == [3, 3], results
    assert "comparing the compiled programs with the other ranks failed" in results[0].stdout
    assert "built for world size 3" in results[1].stdout


NOT_A_NEIGHBOUR = PRELUDE + textwrap.dedent("""
    b = mp.ProgramBuilder("far", world_size=n)
    b.send(b.input("x", [2]), dst=(r + 2) % n)
    p = b.build([b.rank()])
    compile_or_exit(p)
""")


def test_ring_send_to_a_rank_that_is_not_a_neighbour():
    results = run_ranks(NOT_A_NEIGHBOUR, 4, timeout=30)
    for res in results:
        assert res.returncode == 3, (res.rank, res.stdout, res.stderr)
        assert ("instruction 0 (send): attribute 'dst': the ring backend reaches only the "
                "neighbouring ranks") in res.stdout


CHAT_UNDER_LAUNCH = textwrap.dedent("""
    import sys
    from mlxprog.cli import main
    sys.exit(main(["chat", "-m", "/nonexistent.gguf"]))
""")


def test_chat_refuses_to_run_as_one_of_several_processes():
    for res in run_ranks(CHAT_UNDER_LAUNCH, 2, timeout=30):
        assert res.returncode == 1, (res.rank, res.stderr)
        assert "mlxprog chat runs in one process, but this is one of 2" in res.stderr
