"""Download byte progress: the growth of the repo's cache folder, reported while files land."""
import threading
import time

from diffusion_kit.download_progress import GrowthWatcher, folder_bytes


def test_progress_follows_the_bytes_that_land_and_ignores_what_was_cached(tmp_path):
    repo = tmp_path / "models--org--name"
    (repo / "blobs").mkdir(parents=True)
    (repo / "blobs" / "cached").write_bytes(b"x" * 1000)  # already here: not fetched again
    reports = []

    def fetch():
        for i in range(4):
            partial = repo / "blobs" / f"f{i}.incomplete"
            partial.write_bytes(b"y" * 500)
            time.sleep(0.05)
            partial.write_bytes(b"y" * 1000)
            partial.rename(repo / "blobs" / f"f{i}")

    with GrowthWatcher(repo, needed=5000, on_progress=lambda done, total: reports.append((done, total)),
                       interval=0.02):
        worker = threading.Thread(target=fetch)
        worker.start()
        worker.join()
    assert reports[0] == (0, 4000) and reports[-1] == (4000, 4000)
    done = [d for d, _ in reports]
    assert done == sorted(done) and len(set(done)) >= 3  # intermediate figures, never going back
    assert folder_bytes(repo) == 5000


def test_a_folder_that_does_not_exist_yet(tmp_path):
    reports = []
    with GrowthWatcher(tmp_path / "new", needed=10, on_progress=lambda d, t: reports.append((d, t)), interval=0.01):
        (tmp_path / "new").mkdir()
        (tmp_path / "new" / "a").write_bytes(b"z" * 10)
    assert reports[0] == (0, 10) and reports[-1] == (10, 10)


def test_a_partial_file_written_again_never_takes_the_figure_back(tmp_path):
    """A fetch that restarts a file truncates it: the folder shrinks, the reported figure holds until it passes."""
    reports = []
    partial = tmp_path / "blobs" / "f.incomplete"
    partial.parent.mkdir()
    with GrowthWatcher(tmp_path, needed=1000, on_progress=lambda d, t: reports.append(d), interval=0.01):
        partial.write_bytes(b"y" * 600)
        time.sleep(0.1)
        partial.write_bytes(b"y" * 200)  # restarted: truncated, then written again
        time.sleep(0.1)
        partial.write_bytes(b"y" * 1000)
        time.sleep(0.1)
    assert 600 in reports and reports[-1] == 1000
    assert reports == sorted(reports) and 200 not in reports
