"""cluster/redact.py, the one redaction: a table of texts that carry secrets (each must come
out without them, the rest of the text kept) and of texts that carry none (unchanged); the
stream every CLI line goes through; the secrets taken from the environment and Ray's token."""

from __future__ import annotations

import io

import pytest

from cluster.redact import MASK, RedactingStream, known_secrets, redact

PW = "pa55-W0rd_x"

# (text, what must be gone, what must stay)
SECRET_TEXTS = [
    (f"http://user:{PW}@host:5000/path", PW, "http://user:***@host:5000/path"),
    (f"https://user:{PW}@host", PW, "https://user:***@host"),
    (f"http://u:{PW}@127.0.0.1:9 is unreachable", PW, "http://u:***@127.0.0.1:9 is"),
    (f"postgresql://admin:{PW}@db:5432/mlflow", PW, "postgresql://admin:***@db:5432/mlflow"),
    (f"mysql+pymysql://root:{PW}@localhost/x", PW, "mysql+pymysql://root:***@localhost/x"),
    (f"ray://u:{PW}@head:10001", PW, "ray://u:***@head:10001"),
    (f"s3://key:{PW}@bucket/prefix", PW, "s3://key:***@bucket/prefix"),
    (f"https://{PW}@github.com/o/r", PW, "https://***@github.com/o/r"),
    (f"http://user:p@ss:{PW}@host/x", PW, "http://user:***@host/x"),  # '@' in the password
    (f"(<urlopen http://u:{PW}@h:1>)", PW, "http://u:***@h:1"),
    (f"'http://u:{PW}@h:1'", PW, "'http://u:***@h:1'"),
    (f"first http://a:{PW}@h1 then https://b:{PW}@h2", PW, "http://a:***@h1 then https://b:"),
    (f"http://h/api?token={PW}&x=1", PW, "?token=***&x=1"),
    (f"http://h/api?x=1&access_token={PW}", PW, "&access_token=***"),
    (f"http://h/?api_key={PW}", PW, "?api_key=***"),
    (f"http://h/?password={PW}#frag", PW, "?password=***#frag"),
    (f"https://b.s3.amazonaws.com/k?X-Amz-Signature={PW}", PW, "X-Amz-Signature=***"),
    (f"http://h/?sig={PW}", PW, "?sig=***"),
    (f"Authorization: Bearer {PW}", PW, "Authorization: Bearer ***"),
    (f"authorization: basic {PW}", PW, "authorization: basic ***"),
    (f"headers={{'Authorization': 'Bearer {PW}'}}", PW, "'Authorization': 'Bearer ***'"),
    (f"Proxy-Authorization: Basic {PW}", PW, "Proxy-Authorization: Basic ***"),
]

CLEAN_TEXTS = [
    "sqlite:////tmp/a@b/mlflow.db",  # an '@' in a path after the host part
    "mail me at someone@example.com",
    "http://127.0.0.1:5000/#/experiments/1",
    "http://host/path?step=3&metric=loss",
    "user:pw@host without a scheme",
    "geosweep: error: --out: /proc/x is not writable",
    "val/loss = 3.1526 (p=2, lr=3e-3)",
    "",
]


@pytest.mark.parametrize("text, gone, kept", SECRET_TEXTS, ids=range(len(SECRET_TEXTS)))
def test_secrets_are_masked_and_the_rest_kept(text, gone, kept):
    out = redact(text, secrets=())
    assert gone not in out and MASK in out
    assert kept in out


@pytest.mark.parametrize("text", CLEAN_TEXTS)
def test_texts_without_secrets_are_unchanged(text):
    assert redact(text, secrets=()) == text


@pytest.mark.parametrize("name", ["RAY_AUTH_TOKEN", "HF_TOKEN", "GITHUB_TOKEN",
                                  "MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_TOKEN",
                                  "AWS_SECRET_ACCESS_KEY", "OPENAI_API_KEY", "MY_SECRET",
                                  "DB_PASSWD", "GCP_CREDENTIALS"])
def test_credential_variables_are_secrets_wherever_they_appear(name, monkeypatch):
    value = f"v-{name.lower()}-1234"
    monkeypatch.setenv(name, value)
    assert value in known_secrets()
    assert redact(f"failed with {value} in the middle") == f"failed with {MASK} in the middle"


@pytest.mark.parametrize("name, value", [
    ("TOKENIZERS_PARALLELISM", "falsefalse"),  # a TOKEN word part, no credential
    ("RAY_AUTH_TOKEN_PATH", "/tmp/some/token/file"),  # where a token is kept: a path
    ("SSH_AUTH_SOCK", "/tmp/ssh-agent.sock"),
    ("HF_TOKEN", "short"),  # too short to mask everywhere
])
def test_other_variables_are_not(name, value, monkeypatch):
    monkeypatch.setenv(name, value)
    assert value not in known_secrets()


def test_ray_token_file_is_a_secret_and_reread_when_it_changes(tmp_path, monkeypatch):
    monkeypatch.delenv("RAY_AUTH_TOKEN", raising=False)
    f = tmp_path / "auth_token"
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(f))
    assert "tok-one-123456" not in known_secrets()
    f.write_text("tok-one-123456\n")
    assert "tok-one-123456" in known_secrets()
    f.write_text("tok-two-1234567\n")  # `ray start` writes a new one mid-run
    assert "tok-two-1234567" in known_secrets() and "tok-one-123456" not in known_secrets()


def test_stream_redacts_whole_lines_even_across_writes():
    inner = io.StringIO()
    s = RedactingStream(inner)
    s.write("server http://u:")  # a secret split over two writes
    assert inner.getvalue() == ""  # a partial line waits for its end
    s.write(f"{PW}@h:1 down\nnext ")
    assert inner.getvalue() == "server http://u:***@h:1 down\n"
    s.flush()
    assert inner.getvalue().endswith("next ")
    assert PW not in inner.getvalue()


def test_cli_error_lines_are_redacted_and_one_line(capsys):
    from orchestrator.cli import main

    code = main(["jobs", "--address", f"http://user:{PW}@127.0.0.1:9"])
    out, err = capsys.readouterr()
    assert code == 2 and PW not in out + err and err.count("\n") == 1
    assert "http://user:***@127.0.0.1:9" in err
