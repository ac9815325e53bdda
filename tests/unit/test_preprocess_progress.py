"""tools/preprocess_data.py's progress line on a corpus: documents, rates, the share of the input
read, elapsed time and an ETA, every --log-interval documents and once at the end."""
import json
import os
import re

from tests.support.tool_modules import load_tool

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
preprocess_data = load_tool("preprocess_data")


def test_progress_reports_the_share_of_the_input_and_an_eta(tmp_path, capsys):
    lines = [json.dumps({"text": f"document {i} " + "word " * i}) + "\n" for i in range(12)]
    path = tmp_path / "in.jsonl"
    path.write_text("".join(lines))
    preprocess_data.main(["--input", str(path), "--output-prefix", str(tmp_path / "out"),
                          "--vocab-file", os.path.join(ROOT, "data", "gpt2-vocab.json"),
                          "--merge-file", os.path.join(ROOT, "data", "gpt2-merges.txt"), "--log-interval", "5"])
    progress = [line for line in capsys.readouterr().err.splitlines() if line.startswith("Processed")]
    assert len(progress) == 3  # after 5 and 10 documents, and at the end (12)
    size = sum(len(line) for line in lines)  # ASCII: characters are bytes
    for line, documents in zip(progress, (5, 10, 12), strict=True):
        share = 100 * sum(map(len, lines[:documents])) / size
        assert line.startswith(f"Processed {documents} documents (")
        assert f" of {size / 2**20:.2f} MB ({share:.1f}%), elapsed " in line
        assert re.search(r"elapsed \d+:\d\d:\d\d, ETA \d+:\d\d:\d\d\.$", line)
    assert "(100.0%)" in progress[-1] and progress[-1].endswith(", ETA 0:00:00.")
