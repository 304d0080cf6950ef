"""ferry.KVStore under misuse: close() beside puts on other threads, completion callbacks that
close the store, drop its last reference, ask their own ticket or start more batches; hostile
roots (a NUL, bytes that are not UTF-8) and a corrupt journal's error type. Cases that used to
abort the process run in a child, so that a regression fails the test instead of ending pytest."""
import os
import subprocess
import sys
import textwrap
import threading

import pytest

if os.environ.get("FERRY_SKIP_PACKAGE_TESTS"):
    pytest.skip("the package's tests are skipped in the sanitizer run", allow_module_level=True)

torch = pytest.importorskip("torch")

import ferry  # noqa: E402

BLOCK = 4096


def open_store(root, **kw):
    return ferry.KVStore(root, model="m", dtype="bf16", capacity_bytes=BLOCK * 64,
                         block_bytes=BLOCK, **kw)


def block(k):
    return torch.full((BLOCK,), k % 251, dtype=torch.uint8)


def run_child(code, tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code), str(tmp_path)],
                          capture_output=True, text=True, timeout=120, env=env)


def test_close_beside_puts_on_another_thread_refuses_later_puts_and_keeps_acknowledged_ones(
        tmp_path):
    store = open_store(tmp_path)
    acknowledged, errors, first = [], [], threading.Event()

    def putter():
        k = 0
        while True:  # until close refuses a put
            k += 1
            try:
                if store.put([k], [block(k)])[0].ok:
                    acknowledged.append(k)
            except ValueError as e:
                errors.append(str(e))
                return
            finally:
                first.set()

    t = threading.Thread(target=putter)
    t.start()
    first.wait()
    store.close()
    t.join()
    assert len(errors) == 1 and "closed KV store" in errors[0], errors
    with pytest.raises(ValueError, match="closed KV store"):
        store.lookup([0])
    store.close()  # again: nothing to do
    kept = acknowledged[-64:]  # the store holds 64 blocks: older ones may have been evicted
    with open_store(tmp_path) as again:
        back = [torch.empty(BLOCK, dtype=torch.uint8) for _ in kept]
        assert all(r.ok for r in again.get(kept, back))
        assert all(torch.equal(b, block(k)) for k, b in zip(kept, back))


@pytest.mark.parametrize("how", ["close", "last_reference"])
def test_a_callback_closing_the_store_or_holding_its_last_reference(tmp_path, how):
    # Before: "terminate called ... Resource deadlock avoided" (the worker joined itself).
    child = run_child(f"""
        import sys, gc, torch, ferry
        root = sys.argv[1]
        store = ferry.KVStore(root, model="m", dtype="bf16", capacity_bytes=4096 * 16,
                              block_bytes=4096)
        if "{how}" == "close":
            cb = lambda results: store.close()
        else:
            cb = lambda results, keep=store: None
        t = store.put_async([1], [torch.zeros(4096, dtype=torch.uint8)], callback=cb)
        if "{how}" == "close":
            t.wait()
            try:
                store.put([2], [torch.zeros(4096, dtype=torch.uint8)])
                print("put after close: accepted")
            except ValueError as e:
                print("put after close:", e)
            store.close()
        else:
            del store, cb
            gc.collect()
            t.wait()
        print("results:", [r.status for r in t.results()])
        # The writer lock is released once the store's last batch ended (on its thread).
        while True:
            try:
                again = ferry.KVStore(root, model="m", dtype="bf16", capacity_bytes=4096 * 16,
                                      block_bytes=4096)
                break
            except BlockingIOError:
                pass
        print("reopened:", again.lookup([1]))
    """, tmp_path)
    assert child.returncode == 0, child.stderr
    assert "results: ['ok']" in child.stdout, child.stdout
    assert "reopened: 1" in child.stdout, child.stdout
    if how == "close":
        assert "put after close: " in child.stdout and "closed KV store" in child.stdout


def test_ticket_methods_inside_their_own_callback(tmp_path):
    # Before: results() in the callback waited for the callback itself, forever.
    child = run_child("""
        import sys, threading, torch, ferry
        store = ferry.KVStore(sys.argv[1], model="m", dtype="bf16", capacity_bytes=4096 * 16,
                              block_bytes=4096)
        box, go = {}, threading.Event()
        def cb(results):
            go.wait()
            t = box["t"]
            print("inside:", t.ready(), t.wait(), t.wait(0), [r.status for r in t.results()],
                  [r.status for r in results], flush=True)
        box["t"] = store.put_async([1], [torch.zeros(4096, dtype=torch.uint8)], callback=cb)
        go.set()
        print("main:", box["t"].wait(60), flush=True)
        store.close()
    """, tmp_path)
    assert child.returncode == 0, child.stderr
    assert "inside: True True True ['ok'] ['ok']" in child.stdout, child.stdout
    assert "main: True" in child.stdout, child.stdout


def test_callbacks_re_entering_the_store(tmp_path):
    store = open_store(tmp_path)
    assert store.put([100], [block(100)])[0].ok
    seen, failures = [], []
    both_inside = threading.Barrier(2, timeout=60)

    def cb_for(k):
        def cb(results):
            try:
                both_inside.wait()  # both of the store's workers are in callbacks now
                out = torch.empty(BLOCK, dtype=torch.uint8)
                assert store.get([100], [out])[0].ok and torch.equal(out, block(100))
                assert store.lookup([100]) == 1
                assert store.put([k + 10], [block(k + 10)])[0].ok
                back = torch.empty(BLOCK, dtype=torch.uint8)
                inner = store.get_async([k], [back])
                assert [r.status for r in inner.results()] == ["ok"]
                assert torch.equal(back, block(k))
                seen.append(k)
            except BaseException as e:  # noqa: BLE001 - reported by the test below
                failures.append(repr(e))
        return cb

    tickets = [store.put_async([k], [block(k)], callback=cb_for(k)) for k in (1, 2)]
    assert all(t.wait(120) for t in tickets)
    assert not failures, failures
    assert sorted(seen) == [1, 2]
    assert store.lookup([11]) == 1 and store.lookup([12]) == 1
    store.close()


def test_a_root_holding_a_nul_is_refused_and_creates_nothing(tmp_path):
    with pytest.raises(ValueError, match="NUL"):
        open_store(str(tmp_path / "x\0y"))
    with pytest.raises(ValueError, match="NUL"):
        open_store(os.fsencode(tmp_path / "x\0y"))
    assert os.listdir(tmp_path) == []


def test_roots_as_bytes_that_are_not_utf8_and_as_path_objects(tmp_path):
    root = os.fsencode(tmp_path) + b"/kv-\xff"
    with open_store(root) as store:
        assert store.put([1], [block(1)])[0].ok
        directory = store.stats()["directory"]
    assert os.fsencode(directory).startswith(root + b"/ns-")
    assert os.path.isdir(root)
    with open_store(tmp_path / "as-path") as store:  # os.PathLike
        assert store.stats()["directory"].startswith(str(tmp_path / "as-path"))
    with open_store(root) as again:
        assert again.lookup([1]) == 1


def test_a_corrupt_journal_is_a_kv_format_error_naming_the_journal(tmp_path):
    with open_store(tmp_path) as store:
        directory = store.stats()["directory"]
    with open(os.path.join(directory, "journal"), "r+b") as f:
        f.write(b"X")
    with pytest.raises(ferry.KVFormatError) as raised:
        open_store(tmp_path)
    assert not isinstance(raised.value, ferry.SafetensorError)
    assert isinstance(raised.value, ValueError)
    assert os.path.join(directory, "journal") in str(raised.value)


def test_a_fifo_in_place_of_the_journal_is_refused_not_waited_on(tmp_path):
    with open_store(tmp_path) as store:
        directory = store.stats()["directory"]
    journal = os.path.join(directory, "journal")
    os.remove(journal)
    os.mkfifo(journal)
    for read_only in (False, True):
        with pytest.raises(ValueError, match="not a regular file"):
            open_store(tmp_path, read_only=read_only)
