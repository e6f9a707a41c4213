//! The simulator's own certificate authority and the wildcard server certificate
//! `*.<domain>` that every simulated terminal presents, plus the rustls server
//! configuration (TLS 1.2 and 1.3, ALPN `h2` only, ring provider).
//!
//! Keys live only in memory; only the CA certificate is written out (`ca.pem`), for the
//! pods to trust. A new CA is made at every start. No client certificates are asked for.

use std::sync::Arc;

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair, KeyUsagePurpose,
};
use rustls::{
    pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer},
    ServerConfig,
};

use super::SimError;

/// ALPN protocol id of HTTP/2, the only protocol terminals speak.
pub const ALPN_H2: &[u8] = b"h2";

/// The generated CA and the server configuration built on its wildcard certificate.
pub struct FarmTls {
    /// PEM of the CA certificate (what `ca.pem` holds).
    pub ca_pem: String,
    /// DER of the CA certificate, for in-process clients.
    pub ca_der: CertificateDer<'static>,
    /// Server configuration shared by all listeners.
    pub server_config: Arc<ServerConfig>,
}

/// Generates a CA and a `*.<domain>` certificate signed by it.
pub fn generate(domain: &str) -> Result<FarmTls, SimError> {
    let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "posgate POS simulator CA");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate()?)?;

    let mut leaf_params = CertificateParams::new(vec![format!("*.{domain}")])?;
    leaf_params
        .distinguished_name
        .push(DnType::CommonName, format!("*.{domain}"));
    let leaf_key = KeyPair::generate()?;
    let leaf = leaf_params.signed_by(&leaf_key, &ca)?;

    // The chain includes the CA so clients that pin an intermediate-less store still work.
    let chain = vec![leaf.der().clone(), ca.der().clone()];
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(leaf_key.serialize_der()));
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut server_config = ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])?
        .with_no_client_auth()
        .with_single_cert(chain, key)?;
    server_config.alpn_protocols = vec![ALPN_H2.to_vec()];

    Ok(FarmTls {
        ca_pem: ca.pem(),
        ca_der: ca.der().clone(),
        server_config: Arc::new(server_config),
    })
}
