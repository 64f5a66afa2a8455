//! Strict parsing of a Talos client configuration (`talosconfig`).
//!
//! A talosconfig is YAML: `context` names the current context, `contexts` maps names to
//! `endpoints` (apid addresses, port 50000 when none is given), optional default `nodes`,
//! and the mutual-TLS material `ca`, `crt` and `key`, each base64 of PEM. [`parse`] turns it
//! into a [`TalosContext`] ready for a TLS client, or says exactly what is wrong: a missing
//! context, endpoint, certificate or key, or PEM that does not parse. Nothing here opens a
//! connection, and no connection should be attempted without everything mutual TLS needs.
//!
//! The key is read by what its DER holds, not by its PEM label: Talos writes its default
//! Ed25519 client key as `ED25519 PRIVATE KEY` around PKCS#8, ECDSA keys as `EC PRIVATE KEY`
//! (SEC1) and RSA keys as `RSA PRIVATE KEY` (PKCS#1). [`TalosContext::key_pem`] holds it
//! relabelled with the standard label for its format (`PRIVATE KEY`, `EC PRIVATE KEY` or
//! `RSA PRIVATE KEY`), which every TLS library reads.
//!
//! # What this crate must not do
//! No IO, no network: it parses text it is given. Reading the file is the caller's.
#![forbid(unsafe_code)]
#![deny(missing_docs)]

use std::collections::BTreeMap;
use std::fmt;

use base64::Engine;
use serde::Deserialize;

/// apid's port, appended to endpoints given without one.
pub const APID_PORT: u16 = 50000;

/// What the caller may override on the command line.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Overrides {
    /// Use this context instead of the file's current one.
    pub context: Option<String>,
    /// Use these endpoints instead of the context's.
    pub endpoints: Vec<String>,
    /// Use these nodes instead of the context's.
    pub nodes: Vec<String>,
}

/// An apid endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    /// Host name or IP address (IPv6 without brackets).
    pub host: String,
    /// Port.
    pub port: u16,
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.host.contains(':') {
            write!(f, "[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{}:{}", self.host, self.port)
        }
    }
}

/// One context, complete and checked.
#[derive(Clone, PartialEq, Eq)]
pub struct TalosContext {
    /// The context's name.
    pub name: String,
    /// The endpoints, at least one.
    pub endpoints: Vec<Endpoint>,
    /// The default target nodes (may be empty).
    pub nodes: Vec<String>,
    /// The CA certificate(s), PEM.
    pub ca_pem: String,
    /// The client certificate, PEM.
    pub crt_pem: String,
    /// The client key, PEM, labelled by its format (see the crate documentation).
    pub key_pem: String,
}

impl TalosContext {
    /// The Talos roles its client certificate names (the subject's Organizations that
    /// start with `os:`, such as `os:admin` or `os:operator`): what apid grants it. `None`
    /// when the certificate cannot be read as X.509.
    #[must_use]
    pub fn roles(&self) -> Option<Vec<String>> {
        let (_, pem) = x509_parser::pem::parse_x509_pem(self.crt_pem.as_bytes()).ok()?;
        let cert = pem.parse_x509().ok()?;
        let roles = cert
            .subject()
            .iter_organization()
            .filter_map(|o| o.as_str().ok())
            .filter(|o| o.starts_with("os:"))
            .map(str::to_owned)
            .collect();
        Some(roles)
    }
}

impl fmt::Debug for TalosContext {
    /// Never prints the key.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TalosContext")
            .field("name", &self.name)
            .field("endpoints", &self.endpoints)
            .field("nodes", &self.nodes)
            .finish_non_exhaustive()
    }
}

/// What is wrong with a talosconfig. Each names the context and field concerned.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// Not YAML of the talosconfig shape.
    #[error("talosconfig does not parse: {0}")]
    Syntax(String),
    /// No context was chosen and the file names no current one.
    #[error("talosconfig names no current context and none was given")]
    NoContext,
    /// The chosen context does not exist.
    #[error("talosconfig has no context {name:?} (it has: {known})")]
    UnknownContext {
        /// The name asked for.
        name: String,
        /// The names it has.
        known: String,
    },
    /// The context has no endpoint.
    #[error("talosconfig context {context:?} has no endpoints")]
    NoEndpoints {
        /// The context.
        context: String,
    },
    /// An endpoint is not `HOST[:PORT]`.
    #[error("talosconfig context {context:?}: endpoint {endpoint:?} is not HOST[:PORT]")]
    BadEndpoint {
        /// The context.
        context: String,
        /// The endpoint as written.
        endpoint: String,
    },
    /// `ca`, `crt` or `key` is missing or empty.
    #[error("talosconfig context {context:?} has no {field} (mutual TLS needs ca, crt and key)")]
    MissingField {
        /// The context.
        context: String,
        /// `ca`, `crt` or `key`.
        field: &'static str,
    },
    /// `ca`, `crt` or `key` is not base64.
    #[error("talosconfig context {context:?}: {field} is not base64: {message}")]
    NotBase64 {
        /// The context.
        context: String,
        /// The field.
        field: &'static str,
        /// Why.
        message: String,
    },
    /// `ca`, `crt` or `key` decodes to something that is not PEM of the expected kind.
    #[error("talosconfig context {context:?}: {field} is not PEM: {message}")]
    BadPem {
        /// The context.
        context: String,
        /// The field.
        field: &'static str,
        /// Why.
        message: String,
    },
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    #[serde(default)]
    context: Option<String>,
    #[serde(default)]
    contexts: BTreeMap<String, RawContext>,
}

#[derive(Deserialize)]
struct RawContext {
    /// talosctl's deprecated single endpoint, read as one more endpoint (as talosctl does).
    #[serde(default)]
    target: Option<String>,
    #[serde(default)]
    endpoints: Vec<String>,
    #[serde(default)]
    nodes: Vec<String>,
    #[serde(default)]
    ca: Option<String>,
    #[serde(default)]
    crt: Option<String>,
    #[serde(default)]
    key: Option<String>,
}

/// Parses a talosconfig and picks its context (the override's, else the current one),
/// with endpoints and nodes overridden when given.
///
/// # Errors
/// A [`ConfigError`] naming what is wrong.
pub fn parse(text: &str, overrides: &Overrides) -> Result<TalosContext, ConfigError> {
    let raw: RawConfig = serde_saphyr::from_str(text).map_err(|e| {
        // The parser's report spans lines (with a source excerpt); its first line says it.
        let report = e.to_string();
        ConfigError::Syntax(report.lines().next().unwrap_or_default().trim_start_matches("error: ").to_owned())
    })?;
    let name = overrides.context.clone().or(raw.context.filter(|c| !c.is_empty())).ok_or(ConfigError::NoContext)?;
    let Some(context) = raw.contexts.get(&name) else {
        let known = raw.contexts.keys().map(String::as_str).collect::<Vec<_>>().join(", ");
        return Err(ConfigError::UnknownContext { name, known });
    };
    let mut from_file = context.endpoints.clone();
    from_file.extend(context.target.iter().filter(|t| !t.trim().is_empty()).cloned());
    let endpoints = if overrides.endpoints.is_empty() { &from_file } else { &overrides.endpoints };
    if endpoints.is_empty() {
        return Err(ConfigError::NoEndpoints { context: name });
    }
    let endpoints = endpoints
        .iter()
        .map(|e| {
            parse_endpoint(e).ok_or_else(|| ConfigError::BadEndpoint { context: name.clone(), endpoint: e.clone() })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let ca_pem = pem_field(&name, "ca", context.ca.as_deref(), &["CERTIFICATE"])?;
    let crt_pem = pem_field(&name, "crt", context.crt.as_deref(), &["CERTIFICATE"])?;
    let key_pem = key_field(&name, context.key.as_deref())?;
    let nodes = if overrides.nodes.is_empty() { context.nodes.clone() } else { overrides.nodes.clone() };
    Ok(TalosContext { name, endpoints, nodes, ca_pem, crt_pem, key_pem })
}

/// `HOST`, `HOST:PORT`, `[V6]` or `[V6]:PORT`; a bare IPv6 address is taken whole.
fn parse_endpoint(text: &str) -> Option<Endpoint> {
    let text = text.trim();
    let text = text.strip_prefix("https://").unwrap_or(text);
    if text.is_empty() || text.contains(char::is_whitespace) || text.contains('/') {
        return None;
    }
    if let Some(rest) = text.strip_prefix('[') {
        let (host, after) = rest.split_once(']')?;
        let port = match after {
            "" => APID_PORT,
            _ => after.strip_prefix(':')?.parse().ok()?,
        };
        return (!host.is_empty()).then(|| Endpoint { host: host.to_owned(), port });
    }
    match text.matches(':').count() {
        0 => Some(Endpoint { host: text.to_owned(), port: APID_PORT }),
        1 => {
            let (host, port) = text.split_once(':')?;
            (!host.is_empty()).then_some(())?;
            Some(Endpoint { host: host.to_owned(), port: port.parse().ok()? })
        }
        _ => Some(Endpoint { host: text.to_owned(), port: APID_PORT }),
    }
}

/// The labels a client key is found under.
const KEY_LABELS: [&str; 4] = ["PRIVATE KEY", "ED25519 PRIVATE KEY", "EC PRIVATE KEY", "RSA PRIVATE KEY"];

/// Decodes the key field: one PEM block whose DER is a PKCS#8, SEC1 or PKCS#1 private key,
/// re-encoded under the standard label of that format.
fn key_field(context: &str, value: Option<&str>) -> Result<String, ConfigError> {
    use rustls_pki_types::PrivateKeyDer;
    let text = pem_field(context, "key", value, &KEY_LABELS)?;
    let bad = |message: String| ConfigError::BadPem { context: context.to_owned(), field: "key", message };
    let blocks = pem::parse_many(&text).map_err(|e| bad(e.to_string()))?;
    let [block] = blocks.as_slice() else {
        return Err(bad(format!("{} PEM blocks where one key was expected", blocks.len())));
    };
    let label = match PrivateKeyDer::try_from(block.contents()) {
        Ok(PrivateKeyDer::Pkcs8(_)) => "PRIVATE KEY",
        Ok(PrivateKeyDer::Sec1(_)) => "EC PRIVATE KEY",
        Ok(PrivateKeyDer::Pkcs1(_)) => "RSA PRIVATE KEY",
        Ok(_) | Err(_) => {
            return Err(bad(format!("the {:?} block holds no PKCS#8, SEC1 or PKCS#1 private key", block.tag())));
        }
    };
    let config = pem::EncodeConfig::new().set_line_ending(pem::LineEnding::LF);
    Ok(pem::encode_config(&pem::Pem::new(label, block.contents()), config))
}

/// Decodes a base64 field and checks that it holds PEM blocks of an expected tag.
fn pem_field(context: &str, field: &'static str, value: Option<&str>, tags: &[&str]) -> Result<String, ConfigError> {
    let value = value.map(str::trim).filter(|v| !v.is_empty());
    let Some(value) = value else {
        return Err(ConfigError::MissingField { context: context.to_owned(), field });
    };
    let bytes = base64::engine::general_purpose::STANDARD.decode(value).map_err(|e| ConfigError::NotBase64 {
        context: context.to_owned(),
        field,
        message: e.to_string(),
    })?;
    let bad = |message: String| ConfigError::BadPem { context: context.to_owned(), field, message };
    let text = String::from_utf8(bytes).map_err(|_| bad("not UTF-8 text".to_owned()))?;
    let blocks = pem::parse_many(&text).map_err(|e| bad(e.to_string()))?;
    if blocks.is_empty() {
        return Err(bad("no PEM block".to_owned()));
    }
    if let Some(block) = blocks.iter().find(|b| !tags.contains(&b.tag())) {
        return Err(bad(format!("a {:?} block where {} was expected", block.tag(), tags.join(" or "))));
    }
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b64(text: &str) -> String {
        base64::engine::general_purpose::STANDARD.encode(text)
    }

    /// A PEM block under `tag`. A key tag gets a PKCS#8 Ed25519 key (as Go's
    /// `MarshalPKCS8PrivateKey` writes it), any other tag a DER public key.
    fn pem(tag: &str) -> String {
        if tag.ends_with("PRIVATE KEY") {
            return pem_of(tag, &ED25519_PKCS8);
        }
        format!(
            "-----BEGIN {tag}-----\nMCowBQYDK2VwAyEAGb9ECWmEzf6FQbrBZ9w7lshQhqowtrbLDFw4rXAxZuE=\n-----END {tag}-----\n"
        )
    }

    fn pem_of(tag: &str, der: &[u8]) -> String {
        pem::encode_config(&pem::Pem::new(tag, der), pem::EncodeConfig::new().set_line_ending(pem::LineEnding::LF))
    }

    /// PKCS#8 v1 of an Ed25519 seed of 32 bytes of 7.
    const ED25519_PKCS8: [u8; 48] = {
        let mut der = [7u8; 48];
        let head = [0x30, 0x2e, 0x02, 0x01, 0x00, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x04, 0x22, 0x04, 0x20];
        let mut i = 0;
        while i < head.len() {
            der[i] = head[i];
            i += 1;
        }
        der
    };

    /// The start of a SEC1 `ECPrivateKey` (version 1, a 32-byte key) as Go's
    /// `MarshalECPrivateKey` writes it.
    fn sec1() -> Vec<u8> {
        let mut der = vec![0x30, 0x25, 0x02, 0x01, 0x01, 0x04, 0x20];
        der.extend([9u8; 32]);
        der
    }

    /// The start of a PKCS#1 `RSAPrivateKey` (version 0, then the modulus).
    fn pkcs1() -> Vec<u8> {
        let mut der = vec![0x30, 0x0b, 0x02, 0x01, 0x00, 0x02, 0x06];
        der.extend([0x00, 0xc3, 0x01, 0x02, 0x03, 0x05]);
        der
    }

    fn config(ca: &str, crt: &str, key: &str, endpoints: &str) -> String {
        format!(
            "context: prod\ncontexts:\n  prod:\n    endpoints: {endpoints}\n    nodes: [10.5.0.2, 10.5.0.3]\n    ca: {ca}\n    crt: {crt}\n    key: {key}\n  lab:\n    endpoints: [192.168.1.10]\n"
        )
    }

    fn good() -> String {
        config(
            &b64(&pem("CERTIFICATE")),
            &b64(&pem("CERTIFICATE")),
            &b64(&pem("ED25519 PRIVATE KEY")),
            "[10.5.0.2, \"[fd00::2]:50001\"]",
        )
    }

    #[test]
    fn a_complete_context_parses_with_default_ports() {
        let c = parse(&good(), &Overrides::default()).unwrap();
        assert_eq!(c.name, "prod");
        assert_eq!(
            c.endpoints,
            vec![Endpoint { host: "10.5.0.2".into(), port: 50000 }, Endpoint { host: "fd00::2".into(), port: 50001 }]
        );
        assert_eq!(c.endpoints[1].to_string(), "[fd00::2]:50001");
        assert_eq!(c.nodes, vec!["10.5.0.2", "10.5.0.3"]);
        assert!(c.key_pem.starts_with("-----BEGIN PRIVATE KEY-----"), "relabelled: {}", c.key_pem);
        assert!(!format!("{c:?}").contains("PRIVATE"), "Debug never prints the key");
    }

    #[test]
    fn overrides_pick_the_context_endpoints_and_nodes() {
        let o =
            Overrides { context: None, endpoints: vec!["cp.example.com:6443".into()], nodes: vec!["10.5.0.9".into()] };
        let c = parse(&good(), &o).unwrap();
        assert_eq!(c.endpoints, vec![Endpoint { host: "cp.example.com".into(), port: 6443 }]);
        assert_eq!(c.nodes, vec!["10.5.0.9"]);
    }

    #[test]
    fn a_missing_context_is_named() {
        let no_current = good().replace("context: prod\n", "");
        assert_eq!(parse(&no_current, &Overrides::default()), Err(ConfigError::NoContext));
        let o = Overrides { context: Some("staging".into()), ..Overrides::default() };
        assert_eq!(
            parse(&good(), &o),
            Err(ConfigError::UnknownContext { name: "staging".into(), known: "lab, prod".into() })
        );
    }

    #[test]
    fn a_context_without_endpoints_or_tls_material_is_refused_naming_what_is_missing() {
        let o = Overrides { context: Some("lab".into()), ..Overrides::default() };
        assert_eq!(parse(&good(), &o), Err(ConfigError::MissingField { context: "lab".into(), field: "ca" }));
        let no_endpoints = good().replace("endpoints: [10.5.0.2, \"[fd00::2]:50001\"]", "endpoints: []");
        assert_eq!(
            parse(&no_endpoints, &Overrides::default()),
            Err(ConfigError::NoEndpoints { context: "prod".into() })
        );
        for field in ["crt", "key"] {
            let text = good()
                .lines()
                .filter(|l| !l.trim_start().starts_with(&format!("{field}:")))
                .collect::<Vec<_>>()
                .join("\n");
            assert_eq!(
                parse(&text, &Overrides::default()),
                Err(ConfigError::MissingField {
                    context: "prod".into(),
                    field: if field == "crt" { "crt" } else { "key" }
                })
            );
        }
    }

    #[test]
    fn pem_that_does_not_parse_is_refused_naming_the_field() {
        let not_base64 = config("not*base64!", &b64(&pem("CERTIFICATE")), &b64(&pem("PRIVATE KEY")), "[10.5.0.2]");
        assert!(matches!(parse(&not_base64, &Overrides::default()), Err(ConfigError::NotBase64 { field: "ca", .. })));
        let not_pem = config(&b64(&pem("CERTIFICATE")), &b64("hello"), &b64(&pem("PRIVATE KEY")), "[10.5.0.2]");
        assert!(matches!(parse(&not_pem, &Overrides::default()), Err(ConfigError::BadPem { field: "crt", .. })));
        let truncated = config(
            &b64(&pem("CERTIFICATE")),
            &b64(&pem("CERTIFICATE")),
            &b64("-----BEGIN PRIVATE KEY-----\nMCow"),
            "[10.5.0.2]",
        );
        assert!(matches!(parse(&truncated, &Overrides::default()), Err(ConfigError::BadPem { field: "key", .. })));
        let swapped =
            config(&b64(&pem("CERTIFICATE")), &b64(&pem("PRIVATE KEY")), &b64(&pem("PRIVATE KEY")), "[10.5.0.2]");
        let err = parse(&swapped, &Overrides::default()).unwrap_err();
        assert!(matches!(err, ConfigError::BadPem { field: "crt", .. }), "{err}");
    }

    #[test]
    fn malformed_endpoints_and_yaml_are_refused() {
        for endpoint in ["\"10.5.0.2:port\"", "\"http://x/y\"", "\"a b\"", "\"[fd00::2\"", "\":50000\""] {
            let text = config(
                &b64(&pem("CERTIFICATE")),
                &b64(&pem("CERTIFICATE")),
                &b64(&pem("PRIVATE KEY")),
                &format!("[{endpoint}]"),
            );
            assert!(matches!(parse(&text, &Overrides::default()), Err(ConfigError::BadEndpoint { .. })), "{endpoint}");
        }
        let syntax = parse("contexts: [", &Overrides::default()).unwrap_err();
        assert!(
            matches!(&syntax, ConfigError::Syntax(text) if text.contains("line 1") && !text.contains('\n')),
            "{syntax}"
        );
        assert!(matches!(parse("bogus: 1", &Overrides::default()), Err(ConfigError::Syntax(_))));
        assert!(matches!(parse("", &Overrides::default()), Err(ConfigError::Syntax(_) | ConfigError::NoContext)));
    }

    fn with_key(key_pem: &str) -> Result<TalosContext, ConfigError> {
        let text = config(&b64(&pem("CERTIFICATE")), &b64(&pem("CERTIFICATE")), &b64(key_pem), "[10.5.0.2]");
        parse(&text, &Overrides::default())
    }

    #[test]
    fn a_key_is_read_by_its_der_and_relabelled_whatever_its_label() {
        // Talos's default: PKCS#8 under its own label.
        let talos = with_key(&pem_of("ED25519 PRIVATE KEY", &ED25519_PKCS8)).unwrap();
        assert_eq!(talos.key_pem, pem_of("PRIVATE KEY", &ED25519_PKCS8));
        // ECDSA from Go's MarshalECPrivateKey, and RSA from MarshalPKCS1PrivateKey.
        assert_eq!(with_key(&pem_of("EC PRIVATE KEY", &sec1())).unwrap().key_pem, pem_of("EC PRIVATE KEY", &sec1()));
        assert_eq!(
            with_key(&pem_of("RSA PRIVATE KEY", &pkcs1())).unwrap().key_pem,
            pem_of("RSA PRIVATE KEY", &pkcs1())
        );
        // A label that does not match what the DER holds is corrected, not trusted.
        assert_eq!(
            with_key(&pem_of("EC PRIVATE KEY", &ED25519_PKCS8)).unwrap().key_pem,
            pem_of("PRIVATE KEY", &ED25519_PKCS8)
        );
        assert_eq!(with_key(&pem_of("PRIVATE KEY", &sec1())).unwrap().key_pem, pem_of("EC PRIVATE KEY", &sec1()));
    }

    #[test]
    fn a_key_that_is_not_a_private_key_or_not_one_block_is_refused_naming_it() {
        let public = pem("CERTIFICATE").replace("CERTIFICATE", "PRIVATE KEY");
        let err = with_key(&public).unwrap_err();
        assert!(
            matches!(&err, ConfigError::BadPem { field: "key", message, .. } if message.contains("no PKCS#8, SEC1 or PKCS#1")),
            "{err}"
        );
        let two = format!("{}{}", pem("PRIVATE KEY"), pem("PRIVATE KEY"));
        let err = with_key(&two).unwrap_err();
        assert!(
            matches!(&err, ConfigError::BadPem { field: "key", message, .. } if message.contains("2 PEM blocks")),
            "{err}"
        );
    }

    #[test]
    fn talosctls_deprecated_target_is_one_more_endpoint() {
        let text = good()
            .replace("    nodes: [10.5.0.2, 10.5.0.3]\n", "    nodes: [10.5.0.2, 10.5.0.3]\n    target: 10.5.0.9\n");
        let c = parse(&text, &Overrides::default()).unwrap();
        assert_eq!(c.endpoints.last(), Some(&Endpoint { host: "10.5.0.9".into(), port: APID_PORT }));
    }
}
