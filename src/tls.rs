//! TLS material from PEM files, shared by every TLS use of a pod: the terminal dialer
//! (`crate::pos::tls`), the peer client (`crate::peer`) and the HTTPS listener
//! (`crate::http::tls`). Always the ring provider: the build has no aws-lc, and
//! rustls's `builder()` would panic if both were ever compiled in.
//!
//! Every error names the file and what it was for (`what`, e.g. `POS TLS CA file`), so
//! a wrong path or a key that does not match its certificate is one clear line.
//!
//! Not for: building client or server configs (their modules do) or Redis TLS
//! (`crate::store::redis`, which the redis crate configures itself).

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::sign::CertifiedKey;
use rustls::RootCertStore;

/// The ALPN protocol of every HTTP/2 client connection posgate makes (to terminals and
/// to peers): the peer must select it.
pub const ALPN_H2: &[u8] = b"h2";

/// Why TLS material cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsConfigError {
    #[error("{what} {}: cannot read it: {source}", path.display())]
    Read {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{what} {}: {why}", path.display())]
    Invalid {
        what: &'static str,
        path: PathBuf,
        why: String,
    },
    /// No CA file was given (`flag`) and the system trust store yielded no certificate.
    #[error("no {flag} given and no system trust roots found ({why})")]
    NoSystemRoots { flag: &'static str, why: String },
    #[error("TLS configuration: {0}")]
    Rustls(#[from] rustls::Error),
}

/// The crypto provider of every TLS config of the crate.
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
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
pub fn certificates(
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

/// The CA certificates of a PEM bundle as a trust store.
pub fn roots_from_file(what: &'static str, path: &Path) -> Result<RootCertStore, TlsConfigError> {
    let mut roots = RootCertStore::empty();
    for cert in certificates(what, path)? {
        roots
            .add(cert)
            .map_err(|e| invalid(what, path, format!("not a usable CA certificate: {e}")))?;
    }
    Ok(roots)
}

/// The system trust store; `flag` is the CA flag an operator could set instead.
pub fn system_roots(flag: &'static str) -> Result<RootCertStore, TlsConfigError> {
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
        return Err(TlsConfigError::NoSystemRoots { flag, why });
    }
    Ok(roots)
}

/// A certificate chain and its private key (`cert_what` and `key_what` name them in
/// errors), checked to belong together, as a rustls builder takes them.
pub fn chain_and_key(
    (cert_what, cert_file): (&'static str, &Path),
    (key_what, key_file): (&'static str, &Path),
    provider: &CryptoProvider,
) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>), TlsConfigError> {
    let chain = certificates(cert_what, cert_file)?;
    let pem = read(key_what, key_file)?;
    // The parse error is not shown: it could quote a piece of the key.
    let key = PrivateKeyDer::from_pem_slice(&pem).map_err(|_| {
        invalid(
            key_what,
            key_file,
            "no PEM private key (PKCS#8, PKCS#1 or SEC1) in it",
        )
    })?;
    // rustls compares key and certificate only when the certificate is first used;
    // check now so a mismatched pair fails at once, naming both files.
    CertifiedKey::from_der(chain.clone(), key.clone_key(), provider).map_err(|e| {
        let why = format!("does not match key {}: {e}", key_file.display());
        invalid(cert_what, cert_file, why)
    })?;
    Ok((chain, key))
}

/// [`chain_and_key`] as the signing material a certificate resolver hands out.
pub fn certified_key(
    cert: (&'static str, &Path),
    key: (&'static str, &Path),
    provider: &CryptoProvider,
) -> Result<CertifiedKey, TlsConfigError> {
    let (chain, der) = chain_and_key(cert, key, provider)?;
    Ok(CertifiedKey::from_der(chain, der, provider)?)
}
