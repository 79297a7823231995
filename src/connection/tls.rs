//! TLS (`rediss://`) settings of a client: the certificate authorities to trust and the
//! client certificate to present, checked when the client is built, never printed.

use std::fmt;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::RootCertStore;

use crate::error::{Error, Result};

/// The TLS settings of a [`Builder`](crate::Builder), as PEM.
#[derive(Clone, Default)]
pub(crate) struct TlsSettings {
    /// Trusted instead of the system's trust store, when set.
    pub(crate) ca_certificates: Option<Vec<u8>>,
    /// Certificate chain and private key for mutual TLS.
    pub(crate) client_certificate: Option<ClientCertificate>,
}

/// A certificate chain and its private key, in PEM.
#[derive(Clone)]
pub(crate) struct ClientCertificate {
    pub(crate) chain: Vec<u8>,
    pub(crate) key: Vec<u8>,
}

impl TlsSettings {
    fn is_set(&self) -> bool {
        self.ca_certificates.is_some() || self.client_certificate.is_some()
    }

    /// Parses every certificate and the key, so that bad PEM is reported when the client is
    /// built rather than at each connection attempt.
    pub(crate) fn validate(&self) -> Result<()> {
        if let Some(pem) = &self.ca_certificates {
            let mut roots = RootCertStore::empty();
            for cert in parse_certificates(pem, "TLS CA certificates")? {
                roots.add(cert).map_err(|e| {
                    Error::config(format!("TLS CA certificates: not a usable CA: {e}"))
                })?;
            }
        }
        if let Some(client) = &self.client_certificate {
            let chain = parse_certificates(&client.chain, "TLS client certificate")?;
            let key = PrivateKeyDer::from_pem_slice(&client.key).map_err(|e| {
                Error::config(format!("TLS client key: no usable private key: {e}"))
            })?;
            // Checks that the key is of a supported type and belongs to the certificate.
            rustls::ClientConfig::builder_with_provider(Arc::new(provider()))
                .with_safe_default_protocol_versions()
                .map_err(|e| Error::config(format!("TLS: {e}")))?
                .with_root_certificates(RootCertStore::empty())
                .with_client_auth_cert(chain, key)
                .map_err(|e| Error::config(format!("TLS client certificate and key: {e}")))?;
        }
        Ok(())
    }

    /// The redis-rs client for `info`, with these settings when the address is `rediss://`.
    pub(crate) fn redis_client(&self, info: redis::ConnectionInfo) -> Result<redis::Client> {
        let is_tls = matches!(info.addr(), redis::ConnectionAddr::TcpTls { .. });
        if !is_tls {
            if self.is_set() {
                return Err(Error::config(
                    "TLS certificates are set but the address is not a rediss:// URL",
                ));
            }
            return redis::Client::open(info)
                .map_err(|e| Error::config(format!("invalid redis address: {e}")));
        }
        ensure_crypto_provider();
        let client = if self.is_set() {
            let certificates = redis::TlsCertificates {
                client_tls: self
                    .client_certificate
                    .as_ref()
                    .map(|c| redis::ClientTlsConfig {
                        client_cert: c.chain.clone(),
                        client_key: c.key.clone(),
                    }),
                root_cert: self.ca_certificates.clone(),
            };
            redis::Client::build_with_tls(info, certificates)
        } else {
            redis::Client::open(info)
        };
        client.map_err(|e| Error::config(format!("invalid TLS settings: {e}")))
    }
}

/// Every `CERTIFICATE` block of `pem`; at least one.
fn parse_certificates(pem: &[u8], what: &str) -> Result<Vec<CertificateDer<'static>>> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| Error::config(format!("{what}: invalid PEM: {e}")))?;
    if certs.is_empty() {
        return Err(Error::config(format!(
            "{what}: no PEM CERTIFICATE block found"
        )));
    }
    Ok(certs)
}

fn provider() -> rustls::crypto::CryptoProvider {
    rustls::crypto::ring::default_provider()
}

/// redis-rs builds its TLS configurations with rustls's process-wide crypto provider. rustls
/// picks one by itself only when exactly one provider is compiled in; when the program also
/// links another (say `aws-lc-rs`) and installed none, it would panic at the first connection.
/// Installing `ring` then, and only then, is what rustls does itself in the usual case.
fn ensure_crypto_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        // Losing a race to another thread's install is fine: a provider is installed.
        let _ = provider().install_default();
    }
}

impl fmt::Debug for TlsSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let shown = |set: bool| if set { "<set>" } else { "<not set>" };
        f.debug_struct("TlsSettings")
            .field("ca_certificates", &shown(self.ca_certificates.is_some()))
            .field(
                "client_certificate",
                &shown(self.client_certificate.is_some()),
            )
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pem_without_a_certificate_is_a_config_error() {
        for pem in [
            &b""[..],
            b"not a pem",
            b"-----BEGIN CERTIFICATE-----\nAAAA\n",
        ] {
            let tls = TlsSettings {
                ca_certificates: Some(pem.to_vec()),
                client_certificate: None,
            };
            let err = tls.validate().unwrap_err();
            assert!(err.is_config(), "{err}");
        }
    }

    #[test]
    fn debug_shows_whether_set_never_the_key() {
        let tls = TlsSettings {
            ca_certificates: None,
            client_certificate: Some(ClientCertificate {
                chain: b"chain-bytes".to_vec(),
                key: b"secret-key-bytes".to_vec(),
            }),
        };
        let dbg = format!("{tls:?}");
        assert!(!dbg.contains("secret-key-bytes"), "{dbg}");
        assert!(!dbg.contains("chain-bytes"), "{dbg}");
        assert!(dbg.contains("<set>"), "{dbg}");
    }

    #[test]
    fn certificates_need_a_rediss_url() {
        let tls = TlsSettings {
            ca_certificates: Some(b"x".to_vec()),
            client_certificate: None,
        };
        let info = redis::IntoConnectionInfo::into_connection_info("redis://127.0.0.1/").unwrap();
        assert!(tls.redis_client(info).unwrap_err().is_config());
    }
}
