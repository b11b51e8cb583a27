"""The cluster's secrets, made once (``make secrets``) and never committed (.gitignore):

- ``infra/.env`` (mode 0600): the PostgreSQL password of docker-compose.yaml and the Prefect
  server's API auth string, under the names the server (PREFECT_SERVER_API_AUTH_STRING) and its
  clients (PREFECT_API_AUTH_STRING) read. Compose reads the file by itself; a shell takes it with
  ``set -a && . infra/.env && set +a``.
- ``infra/tls/``: the Dask cluster's certificates: a CA, and a certificate and key signed by it
  for each role (scheduler, worker, client), with ``ROLE.env``, the Dask settings that make a
  process of that role speak TLS only (paths from the repository root). The CA's key is not
  kept: no one can sign another certificate the cluster trusts.

What exists is kept: a run only makes what is missing, so running it again never changes a
secret (delete a file or folder to make it anew). Only the standard library and the openssl
command: it runs before any virtualenv exists.

    python3 infra/make_secrets.py
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
ENV_FILE = REPO / "infra" / ".env"
TLS_DIR = REPO / "infra" / "tls"
ROLES = ("scheduler", "worker", "client")
# Certificates last ten years: renewing one means new files on every host of the cluster.
DAYS = "3650"
# Every certificate serves as either end of a connection; Dask checks the CA, not host names.
LEAF_EXTENSIONS = ("basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\n"
                   "extendedKeyUsage=serverAuth,clientAuth\n")
DASK = "DASK_DISTRIBUTED__COMM__"


def dask_env(role: str, folder: Path) -> dict[str, str]:
    """The Dask settings of a process of ``role`` whose certificates are in ``folder``. A worker
    is a client too (a task that submits tasks): it shows the worker's certificate."""
    env = {f"{DASK}REQUIRE_ENCRYPTION": "True", f"{DASK}TLS__CA_FILE": str(folder / "ca.pem")}
    for as_role in (role, "client") if role == "worker" else (role,):
        env[f"{DASK}TLS__{as_role.upper()}__CERT"] = str(folder / f"{role}.pem")
        env[f"{DASK}TLS__{as_role.upper()}__KEY"] = str(folder / f"{role}-key.pem")
    return env


def make_env_file(path: Path = ENV_FILE) -> bool:
    """Write ``path`` with new random values unless it exists; True when written."""
    auth = secrets.token_urlsafe(32)  # URL- and shell-safe: [A-Za-z0-9_-]
    text = ("# vlcorpus's secrets, made by `make secrets` (infra/make_secrets.py): never commit or share\n"
            "# this file. Compose reads it; a shell takes it with: set -a && . infra/.env && set +a\n"
            f"POSTGRES_PASSWORD={secrets.token_urlsafe(32)}\n"
            f"PREFECT_SERVER_API_AUTH_STRING={auth}\n"
            f"PREFECT_API_AUTH_STRING={auth}\n")
    part = path.with_name(f"{path.name}.{os.getpid()}.part")
    fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w") as out:
            out.write(text)
        # A link, unlike a rename, never replaces a file that another run made meanwhile.
        os.link(part, path)
    except FileExistsError:
        return False
    finally:
        part.unlink(missing_ok=True)
    return True


def make_tls(folder: Path = TLS_DIR, shown_as: Path | None = None) -> bool:
    """The CA, each role's certificate and key, and each role's Dask settings (paths written as
    ``shown_as``, by default relative to the repository), made in ``folder`` unless it exists
    with files in it; True when made."""
    if folder.is_dir() and any(folder.iterdir()):
        return False
    if shutil.which("openssl") is None:
        raise SystemExit("make_secrets: needs the openssl command (apt-get install -y openssl)")
    shown = shown_as or _from_repo(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".tls-", dir=folder.parent))  # mode 0700
    try:
        with tempfile.TemporaryDirectory() as scratch:
            ca_key = Path(scratch) / "ca-key.pem"
            _openssl("req", "-x509", "-new", *_new_key(ca_key), "-days", DAYS,
                     "-subj", "/CN=vlcorpus-dask-ca", "-out", str(work / "ca.pem"))
            extensions = Path(scratch) / "leaf.ext"
            extensions.write_text(LEAF_EXTENSIONS)
            for role in ROLES:
                request = Path(scratch) / f"{role}.csr"
                _openssl("req", "-new", *_new_key(work / f"{role}-key.pem"),
                         "-subj", f"/CN=vlcorpus-dask-{role}", "-out", str(request))
                _openssl("x509", "-req", "-in", str(request), "-CA", str(work / "ca.pem"),
                         "-CAkey", str(ca_key), "-set_serial", str(secrets.randbits(64)),
                         "-days", DAYS, "-extfile", str(extensions), "-out", str(work / f"{role}.pem"))
                (work / f"{role}.env").write_text(
                    f"# Dask over TLS for a {role} (infra/README.md, On a Dask cluster)\n"
                    + "".join(f"{k}={v}\n" for k, v in dask_env(role, shown).items()))
        for key in work.glob("*-key.pem"):
            key.chmod(0o600)
        try:
            # A rename replaces an empty folder (one docker made for a missing mount) but not
            # one that another run filled meanwhile.
            os.rename(work, folder)
        except OSError:
            return False
        return True
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _new_key(path: Path) -> list[str]:
    return ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", str(path)]


def _openssl(*args: str) -> None:
    done = subprocess.run(["openssl", *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"make_secrets: openssl {args[0]} failed: {done.stderr.strip().splitlines()[-1]}")


def _from_repo(path: Path) -> Path:
    """``path`` as the commands of infra/README.md name it, from the repository's root."""
    try:
        return path.resolve().relative_to(REPO)
    except ValueError:
        return path.resolve()


def main() -> None:
    """Make what is missing and say, in a line each, what was made and what kept (no value)."""
    env = "made (mode 0600)" if make_env_file() else "kept: it exists (delete it to make new secrets)"
    print(f"{_from_repo(ENV_FILE)}: {env}")
    tls = "made: " + ", ".join(sorted(p.name for p in TLS_DIR.iterdir())) if make_tls() \
        else "kept: it exists (delete it to make new certificates)"
    print(f"{_from_repo(TLS_DIR)}/: {tls}")


if __name__ == "__main__":
    main()
