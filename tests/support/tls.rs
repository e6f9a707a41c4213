//! `TestPki`: a throwaway private CA that issued a server certificate for `localhost` and
//! 127.0.0.1, a client certificate, and a server certificate for the name
//! [`PEER_NAME`] only (one certificate all pods share), as PEM files in a temporary
//! directory, for the `rediss://` and HTTPS tests.
//!
//! What it does not do: anything a real PKI needs (revocation, rotation, intermediates).

use std::path::PathBuf;

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};

/// The only name in the `peer` certificate.
pub const PEER_NAME: &str = "posgate-peer.posgate.svc";

/// A CA and the certificates it issued, each written to `<dir>/<name>.pem`.
pub struct TestPki {
    dir: tempfile::TempDir,
}

impl TestPki {
    /// Generates a CA (ECDSA P-256, like every key here), a server certificate and a
    /// client certificate, each with its key.
    pub fn generate() -> TestPki {
        let dir = tempfile::tempdir().expect("temp dir for certificates");
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "posgate test CA");
        let ca_key = KeyPair::generate().expect("CA key");
        let ca = CertifiedIssuer::self_signed(ca_params, ca_key).expect("CA certificate");
        let pki = TestPki { dir };
        pki.write("ca", &ca.pem());

        let local = || vec!["localhost".to_string(), "127.0.0.1".to_string()];
        for (name, purpose, names) in [
            ("server", ExtendedKeyUsagePurpose::ServerAuth, local()),
            ("client", ExtendedKeyUsagePurpose::ClientAuth, local()),
            (
                "peer",
                ExtendedKeyUsagePurpose::ServerAuth,
                vec![PEER_NAME.to_string()],
            ),
        ] {
            let mut params = CertificateParams::new(names).expect("leaf params");
            params
                .distinguished_name
                .push(DnType::CommonName, format!("posgate test {name}"));
            params.extended_key_usages = vec![purpose];
            let key = KeyPair::generate().expect("leaf key");
            let cert = params.signed_by(&key, &ca).expect("leaf certificate");
            pki.write(name, &cert.pem());
            pki.write(&format!("{name}-key"), &key.serialize_pem());
        }
        pki
    }

    fn write(&self, name: &str, pem: &str) {
        std::fs::write(self.path(name), pem).expect("write PEM file");
    }

    /// `<dir>/<name>.pem`: `ca`, `server`, `server-key`, `client`, `client-key`, `peer`
    /// or `peer-key`.
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(format!("{name}.pem"))
    }

    /// The directory the files are in, for tests that add files of their own.
    pub fn dir(&self) -> PathBuf {
        self.dir.path().to_path_buf()
    }
}
