"""TLS, mutual TLS and the token file against a real broker process on loopback."""
import datetime
import subprocess
import sys

import grpc
import pytest

from diffusion.v1 import broker_pb2, broker_pb2_grpc
from service_kit.auth import TokenBook, TokenFileError, digest
from service_kit.security import ClientSecurity, open_channel
from service_kit.service_process import start_service


def _pem_pair(common_name: str, issuer=None, is_ca: bool = False):
    """A key and a certificate for `common_name` (localhost and 127.0.0.1), signed by `issuer` or by itself."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    signer_key, signer_name = (key, name) if issuer is None else (issuer[0], issuer[1].subject)
    now = datetime.datetime.now(datetime.timezone.utc)
    import ipaddress

    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(signer_name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=is_ca, path_length=None), critical=True)
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                                        x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .sign(signer_key, hashes.SHA256()))
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    return key, cert, key_pem, cert.public_bytes(serialization.Encoding.PEM)


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    root = tmp_path_factory.mktemp("pki")
    ca = _pem_pair("test-ca", is_ca=True)
    server = _pem_pair("localhost", issuer=ca)
    client = _pem_pair("alice", issuer=ca)
    files = {}
    for name, pair in (("ca", ca), ("server", server), ("client", client)):
        (root / f"{name}.key").write_bytes(pair[2])
        (root / f"{name}.crt").write_bytes(pair[3])
        files[name] = (root / f"{name}.key", root / f"{name}.crt")
    (root / "tokens").write_text(f"alice user 10 {digest('alice-token')}\n")
    files["tokens"] = root / "tokens"
    return files


def status(address: str, security: ClientSecurity):
    channel = open_channel(address, security, aio=False)
    try:
        return broker_pb2_grpc.GpuBrokerServiceStub(channel).Status(broker_pb2.StatusRequest(), timeout=3)
    finally:
        channel.close()


def test_tls_with_tokens(pki):
    ca = pki["ca"][1].read_bytes()
    proc = start_service("gpu_broker", "--fake-devices", "1x1GiB", "--tls-cert", str(pki["server"][1]),
                         "--tls-key", str(pki["server"][0]), "--auth-token-file", str(pki["tokens"]))
    try:
        assert status(proc.address, ClientSecurity(token="alice-token", tls_ca=ca)).state.devices
        with pytest.raises(grpc.RpcError) as e:
            status(proc.address, ClientSecurity(tls_ca=ca))
        assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
        with pytest.raises(grpc.RpcError) as e:  # plaintext to a TLS port never gets an answer
            status(proc.address, ClientSecurity(token="alice-token"))
        assert e.value.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
    finally:
        proc.stop()


def test_mutual_tls_wants_a_client_certificate(pki):
    ca = pki["ca"][1].read_bytes()
    proc = start_service("gpu_broker", "--fake-devices", "1x1GiB", "--tls-cert", str(pki["server"][1]),
                         "--tls-key", str(pki["server"][0]), "--tls-client-ca", str(pki["ca"][1]))
    try:
        signed = ClientSecurity(tls_ca=ca, tls_cert=pki["client"][1].read_bytes(), tls_key=pki["client"][0].read_bytes())
        assert status(proc.address, signed).state.devices
        with pytest.raises(grpc.RpcError) as e:
            status(proc.address, ClientSecurity(tls_ca=ca))
        assert e.value.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
    finally:
        proc.stop()


@pytest.mark.parametrize("text, error", [
    ("alice user 10\n", "want 'identity role max_priority sha256'"),
    (f"alice boss 10 {digest('x')}\n", "role must be"),
    (f"al ice user 10 {digest('x')}\n", "want 'identity"),
    (f"alice user ten {digest('x')}\n", "max_priority"),
    ("alice user 10 not-a-digest\n", "sha256"),
    (f"alice user 10 {digest('x')}\nalice user 10 {digest('y')}\n", "twice"),
    ("# only a comment\n", "names no tokens"),
])
def test_bad_token_files_stop_the_service_at_start(tmp_path, text, error):
    path = tmp_path / "tokens"
    path.write_text(text)
    with pytest.raises(TokenFileError, match=error):
        TokenBook.load(path)
    run = subprocess.run([sys.executable, "-m", "gpu_broker", "--listen", "127.0.0.1:0", "--fake-devices", "1x1GiB",
                          "--auth-token-file", str(path)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and error.split("'")[0] in run.stderr


def test_new_token_prints_a_line_the_file_accepts(tmp_path):
    run = subprocess.run([sys.executable, "-m", "service_kit.auth", "new", "bob", "user", "5"], capture_output=True,
                         text=True, timeout=30, check=True)
    token = run.stderr.rsplit(" ", 1)[-1].strip()
    (tmp_path / "tokens").write_text(run.stdout)
    caller = TokenBook.load(tmp_path / "tokens").authenticate([("authorization", f"Bearer {token}")])
    assert (caller.identity, caller.role, caller.max_priority) == ("bob", "user", 5)
