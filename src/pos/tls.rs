//! The TLS client configuration for terminal connections: ring provider, ALPN `h2`,
//! trust roots from a PEM CA bundle (`--pos-ca`) or the system store, and an optional
//! client certificate for mutual TLS.
//!
//! Every file is read and checked here, once, at start-up, and every error names the
//! file: a wrong path or a key that does not match its certificate must stop the pod
//! with a clear message instead of failing every dial later with a vague one.
//!
//! Not for: dialing or certificate checks per connection (that is `dialer`), and not
//! for Redis TLS (`crate::store::redis`).

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::{ClientConfig, RootCertStore};

/// The ALPN protocol terminals must select.
pub const ALPN_H2: &[u8] = b"h2";

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

/// Why the terminal TLS configuration cannot be built.
#[derive(Debug, thiserror::Error)]
pub enum TlsConfigError {
    #[error("POS TLS {what} {}: cannot read it: {source}", path.display())]
    Read {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("POS TLS {what} {}: {why}", path.display())]
    Invalid {
        what: &'static str,
        path: PathBuf,
        why: String,
    },
    /// No CA file was given and the system trust store yielded no certificate.
    #[error("POS TLS: no --pos-ca given and no system trust roots found ({0})")]
    NoSystemRoots(String),
    #[error("POS TLS configuration: {0}")]
    Rustls(#[from] rustls::Error),
}

/// Builds the client configuration terminals are dialed with.
pub fn client_config(files: &TlsFiles) -> Result<Arc<ClientConfig>, TlsConfigError> {
    // Explicit provider: if another crate compiles aws-lc in too, `builder()` panics.
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let roots = match &files.ca_file {
        Some(path) => roots_from_file(path)?,
        None => system_roots()?,
    };
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots);
    let mut config = match &files.client {
        Some(id) => {
            let (chain, key) = identity(id, &provider)?;
            builder.with_client_auth_cert(chain, key)?
        }
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![ALPN_H2.to_vec()];
    Ok(Arc::new(config))
}

fn read(what: &'static str, path: &Path) -> Result<Vec<u8>, TlsConfigError> {
    std::fs::read(path).map_err(|source| TlsConfigError::Read {
        what,
        path: path.to_owned(),
        source,
    })
}

fn invalid(what: &'static str, path: &Path, why: impl Into<String>) -> TlsConfigError {
    TlsConfigError::Invalid {
        what,
        path: path.to_owned(),
        why: why.into(),
    }
}

/// The certificates of a PEM file; none at all is an error, since an empty trust store
/// or chain would only fail later, at every connection.
fn certificates(
    what: &'static str,
    path: &Path,
) -> Result<Vec<CertificateDer<'static>>, TlsConfigError> {
    let pem = read(what, path)?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| invalid(what, path, format!("not valid PEM: {e}")))?;
    if certs.is_empty() {
        return Err(invalid(what, path, "no PEM CERTIFICATE in it"));
    }
    Ok(certs)
}

fn roots_from_file(path: &Path) -> Result<RootCertStore, TlsConfigError> {
    let mut roots = RootCertStore::empty();
    for cert in certificates("CA file", path)? {
        roots
            .add(cert)
            .map_err(|e| invalid("CA file", path, format!("not a usable CA certificate: {e}")))?;
    }
    Ok(roots)
}

fn system_roots() -> Result<RootCertStore, TlsConfigError> {
    let found = rustls_native_certs::load_native_certs();
    let mut roots = RootCertStore::empty();
    // Some system bundles hold a few certificates webpki cannot parse; skip those
    // rather than refuse all of them.
    let (added, _ignored) = roots.add_parsable_certificates(found.certs);
    if added == 0 {
        let why = match found.errors.first() {
            Some(e) => e.to_string(),
            None => "the system store is empty".into(),
        };
        return Err(TlsConfigError::NoSystemRoots(why));
    }
    Ok(roots)
}

fn identity(
    id: &ClientIdentity,
    provider: &CryptoProvider,
) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>), TlsConfigError> {
    let chain = certificates("client certificate", &id.cert_file)?;
    let pem = read("client key", &id.key_file)?;
    // The parse error is not shown: it could quote a piece of the key.
    let key = PrivateKeyDer::from_pem_slice(&pem).map_err(|_| {
        invalid(
            "client key",
            &id.key_file,
            "no PEM private key (PKCS#8, PKCS#1 or SEC1) in it",
        )
    })?;
    // rustls compares key and certificate only when a server asks for the certificate;
    // check now so a mismatched pair fails at start, naming both files.
    rustls::sign::CertifiedKey::from_der(chain.clone(), key.clone_key(), provider).map_err(
        |e| {
            let why = format!("does not match key {}: {e}", id.key_file.display());
            invalid("client certificate", &id.cert_file, why)
        },
    )?;
    Ok((chain, key))
}

#[cfg(test)]
mod tests {
    use std::fs;

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
