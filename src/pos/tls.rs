//! The TLS client configuration for terminal connections: ring provider, ALPN `h2`,
//! trust roots from a PEM CA bundle (`--pos-ca`) or the system store, and an optional
//! client certificate for mutual TLS.
//!
//! Every file is read and checked here (with the PEM helpers of `crate::tls`) at
//! start-up and on each reload, and every error names the file: a wrong path or a key that does not match its certificate must stop the pod
//! with a clear message instead of failing every dial later with a vague one.
//!
//! Not for: dialing or certificate checks per connection (that is `dialer`), and not
//! for Redis TLS (`crate::store::redis`).

use crate::tls::ALPN_H2;
use std::path::PathBuf;
use std::sync::Arc;

use rustls::{ClientConfig, RootCertStore};

pub use crate::tls::TlsConfigError;
use crate::tls::{chain_and_key, provider, roots_from_file, system_roots};

/// Where the TLS material for terminal connections comes from.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TlsFiles {
    /// PEM bundle of CA certificates to trust instead of the system roots.
    pub ca_file: Option<PathBuf>,
    /// Client certificate chain and key for mutual TLS.
    pub client: Option<ClientIdentity>,
}

/// A client certificate chain and its private key, both PEM files. Only paths, so
/// `Debug` may show them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClientIdentity {
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
}

/// Builds the client configuration terminals are dialed with.
pub fn client_config(files: &TlsFiles) -> Result<Arc<ClientConfig>, TlsConfigError> {
    // Explicit provider: if another crate compiles aws-lc in too, `builder()` panics.
    let provider = provider();
    let roots: RootCertStore = match &files.ca_file {
        Some(path) => roots_from_file("POS TLS CA file", path)?,
        None => system_roots("--pos-ca")?,
    };
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots);
    let mut config = match &files.client {
        Some(id) => {
            let (chain, key) = chain_and_key(
                ("POS TLS client certificate", &id.cert_file),
                ("POS TLS client key", &id.key_file),
                &provider,
            )?;
            builder.with_client_auth_cert(chain, key)?
        }
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![ALPN_H2.to_vec()];
    Ok(Arc::new(config))
}

#[cfg(test)]
mod tests {
    use std::fs;
    use std::path::Path;

    use rcgen::{CertificateParams, KeyPair};

    use super::*;

    fn write(dir: &Path, name: &str, content: &str) -> PathBuf {
        let path = dir.join(name);
        fs::write(&path, content).unwrap();
        path
    }

    fn self_signed(name: &str) -> (String, String) {
        let key = KeyPair::generate().unwrap();
        let cert = CertificateParams::new(vec![name.to_string()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        (cert.pem(), key.serialize_pem())
    }

    #[test]
    fn ca_file_gives_h2_config() {
        let dir = tempfile::tempdir().unwrap();
        let (cert, _) = self_signed("ca.test");
        let ca = write(dir.path(), "ca.pem", &cert);
        let files = TlsFiles {
            ca_file: Some(ca),
            client: None,
        };
        let config = client_config(&files).unwrap();
        assert_eq!(config.alpn_protocols, vec![b"h2".to_vec()]);
        assert!(!config.client_auth_cert_resolver.has_certs());
    }

    #[test]
    fn missing_or_empty_ca_file_names_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("nope.pem");
        let err = client_config(&TlsFiles {
            ca_file: Some(missing.clone()),
            client: None,
        })
        .unwrap_err();
        assert!(matches!(err, TlsConfigError::Read { .. }), "{err:?}");
        assert!(err.to_string().contains("nope.pem"), "{err}");

        let empty = write(dir.path(), "empty.pem", "not pem at all\n");
        let err = client_config(&TlsFiles {
            ca_file: Some(empty),
            client: None,
        })
        .unwrap_err();
        assert!(matches!(err, TlsConfigError::Invalid { .. }), "{err:?}");
        assert!(err.to_string().contains("empty.pem"), "{err}");
    }

    #[test]
    fn client_identity_is_checked() {
        let dir = tempfile::tempdir().unwrap();
        let (ca, _) = self_signed("ca.test");
        let ca_file = Some(write(dir.path(), "ca.pem", &ca));
        let (cert, key) = self_signed("client.test");
        let (_, other_key) = self_signed("other.test");
        let cert_file = write(dir.path(), "client.pem", &cert);
        let key_file = write(dir.path(), "client.key", &key);
        let wrong_key = write(dir.path(), "wrong.key", &other_key);
        let no_key = write(dir.path(), "nokey.pem", &cert);

        let ok = client_config(&TlsFiles {
            ca_file: ca_file.clone(),
            client: Some(ClientIdentity {
                cert_file: cert_file.clone(),
                key_file,
            }),
        })
        .unwrap();
        assert!(ok.client_auth_cert_resolver.has_certs());

        for (key_file, expect) in [(wrong_key, "client.pem"), (no_key, "nokey.pem")] {
            let err = client_config(&TlsFiles {
                ca_file: ca_file.clone(),
                client: Some(ClientIdentity {
                    cert_file: cert_file.clone(),
                    key_file,
                }),
            })
            .unwrap_err();
            assert!(matches!(err, TlsConfigError::Invalid { .. }), "{err:?}");
            assert!(err.to_string().contains(expect), "{err}");
        }
    }
}
