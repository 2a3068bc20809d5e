"""Files written whole (`gpuyantra.files`): readers at the same moment see all of them or none."""

from __future__ import annotations

import threading

from gpuyantra.files import write_whole


def test_a_reader_never_sees_a_candidate_file_half_written(tmp_path):
    path = tmp_path / "rms_norm_0123456789ab.py"
    text = 'OP = "rms_norm"\n' + "# padding\n" * 200_000  # ~2 MB: a truncate-then-write shows its gap
    write_whole(path, text)
    seen: list[int] = []
    done = threading.Event()

    def rewrite() -> None:
        for _ in range(30):
            write_whole(path, text)
        done.set()

    writer = threading.Thread(target=rewrite)
    writer.start()
    while not done.is_set():
        seen.append(len(path.read_text()))
    writer.join()
    assert seen and set(seen) == {len(text)}
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]  # no partial file left behind
