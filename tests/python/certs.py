"""Test certificates made with the openssl command line: self-signed device certificates, and a
CA with device certificates it signs."""

import subprocess
from pathlib import Path


def run(*args):
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def self_signed(dir: Path, cn: str) -> tuple[Path, Path]:
    key, cert = dir / f"{cn}.key", dir / f"{cn}.pem"
    run("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", str(key),
        "-out", str(cert), "-days", "30", "-subj", f"/CN={cn}")
    return cert, key


def ca(dir: Path, name: str) -> tuple[Path, Path]:
    key, cert = dir / f"{name}-ca.key", dir / f"{name}-ca.pem"
    run("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", str(key),
        "-out", str(cert), "-days", "30", "-subj", f"/CN={name} test CA",
        "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign")
    return cert, key


def signed_by(dir: Path, cn: str, ca_cert: Path, ca_key: Path) -> tuple[Path, Path]:
    key, csr, cert = dir / f"{cn}.key", dir / f"{cn}.csr", dir / f"{cn}.pem"
    ext = dir / f"{cn}.ext"
    ext.write_text("basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=clientAuth\n")
    run("req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", str(key),
        "-out", str(csr), "-subj", f"/CN={cn}")
    run("x509", "-req", "-in", str(csr), "-CA", str(ca_cert), "-CAkey", str(ca_key), "-CAcreateserial",
        "-out", str(cert), "-days", "30", "-extfile", str(ext))
    return cert, key


def thumbprint(cert: Path) -> str:
    out = subprocess.run(["openssl", "x509", "-in", str(cert), "-noout", "-fingerprint", "-sha1"],
                         check=True, capture_output=True, text=True).stdout
    return out.strip().split("=", 1)[1].replace(":", "")


def intermediate(dir: Path, name: str, ca_cert: Path, ca_key: Path) -> tuple[Path, Path]:
    """An intermediate CA signed by `ca_cert` (it can sign device certificates itself)."""
    key, csr, cert = dir / f"{name}-ca.key", dir / f"{name}-ca.csr", dir / f"{name}-ca.pem"
    ext = dir / f"{name}-ca.ext"
    ext.write_text("basicConstraints=critical,CA:TRUE\nkeyUsage=critical,keyCertSign,cRLSign\n")
    run("req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", str(key),
        "-out", str(csr), "-subj", f"/CN={name} intermediate CA")
    run("x509", "-req", "-in", str(csr), "-CA", str(ca_cert), "-CAkey", str(ca_key), "-CAcreateserial",
        "-out", str(cert), "-days", "30", "-extfile", str(ext))
    return cert, key


def chain_file(path: Path, *certs: Path) -> Path:
    """One PEM file holding `certs` in order (leaf first): what a device presents in TLS."""
    path.write_text("".join(c.read_text() for c in certs))
    return path


def sha256_thumbprint(cert: Path) -> str:
    out = subprocess.run(["openssl", "x509", "-in", str(cert), "-noout", "-fingerprint", "-sha256"],
                         check=True, capture_output=True, text=True).stdout
    return out.strip().split("=", 1)[1].replace(":", "")


def server_signed_by(dir: Path, name: str, names: list[str], ca_cert: Path, ca_key: Path) -> tuple[Path, Path]:
    """A TLS server certificate for `names` (DNS names or IP addresses) signed by `ca_cert`."""
    key, csr, cert = dir / f"{name}.key", dir / f"{name}.csr", dir / f"{name}.pem"
    ext = dir / f"{name}.ext"
    sans = ",".join(("IP:" if n.replace(".", "").isdigit() or ":" in n else "DNS:") + n for n in names)
    ext.write_text("basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\n"
                   f"extendedKeyUsage=serverAuth\nsubjectAltName={sans}\n")
    run("req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", str(key),
        "-out", str(csr), "-subj", f"/CN={names[0]}")
    run("x509", "-req", "-in", str(csr), "-CA", str(ca_cert), "-CAkey", str(ca_key), "-CAcreateserial",
        "-out", str(cert), "-days", "30", "-extfile", str(ext))
    return cert, key
