//! Certificates and talosconfigs as Talos writes them.
//!
//! Talos's OS CA and the certificates it issues are Ed25519 by default; `talosctl gen
//! config` writes the admin client key as PEM `ED25519 PRIVATE KEY` around PKCS#8
//! (`siderolabs/crypto` `x509/key.go`), and an ECDSA key as `EC PRIVATE KEY` around SEC1
//! with the curve named (Go's `MarshalECPrivateKey`). The talosconfig itself is YAML as
//! gopkg.in/yaml.v3 prints it (four-space indentation), each of `ca`, `crt` and `key` the
//! base64 of its PEM.

use base64::Engine;
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, PKCS_ECDSA_P256_SHA256, PKCS_ED25519, SignatureAlgorithm, date_time_ymd,
};

/// The key algorithm of a CA or a leaf.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyKind {
    /// Ed25519, Talos's default.
    Ed25519,
    /// ECDSA P-256.
    EcdsaP256,
}

impl KeyKind {
    fn algorithm(self) -> &'static SignatureAlgorithm {
        match self {
            Self::Ed25519 => &PKCS_ED25519,
            Self::EcdsaP256 => &PKCS_ECDSA_P256_SHA256,
        }
    }
}

/// A certificate authority, as Talos's OS CA.
pub struct Ca {
    /// Its certificate, PEM.
    pub cert_pem: String,
    kind: KeyKind,
    issuer: Issuer<'static, KeyPair>,
}

/// A leaf certificate and its key.
pub struct Leaf {
    /// The certificate, PEM.
    pub cert_pem: String,
    /// The key as PKCS#8 under `PRIVATE KEY`, as most TLS libraries read it.
    pub key_pem: String,
    /// The key as Talos writes it: `ED25519 PRIVATE KEY` (PKCS#8) or `EC PRIVATE KEY`
    /// (SEC1, the curve named).
    pub talos_key_pem: String,
}

/// How a leaf is made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Validity {
    /// Valid now.
    Current,
    /// Expired at the start of 2021 (Talos admin certificates last a year).
    Expired,
}

impl Ca {
    /// A new CA of `kind`, organisation `talos` (as every Talos cluster's OS CA: two
    /// clusters' CAs have the same name).
    #[must_use]
    pub fn new(kind: KeyKind) -> Self {
        Self::named(kind, "talos")
    }

    /// A new CA of `kind` with another organisation.
    #[must_use]
    pub fn named(kind: KeyKind, organisation: &str) -> Self {
        let key = KeyPair::generate_for(kind.algorithm()).expect("a key");
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::DigitalSignature];
        params.distinguished_name = DistinguishedName::new();
        params.distinguished_name.push(DnType::OrganizationName, organisation);
        let cert = params.self_signed(&key).expect("a self-signed CA");
        Self { cert_pem: cert.pem(), kind, issuer: Issuer::new(params, key) }
    }

    /// The OS CA `talosctl gen config` wrote into a machine configuration
    /// (`machine.ca.crt` and `machine.ca.key`, each PEM once decoded): leaves it issues are
    /// trusted by the talosconfig written beside it. The key is PKCS#8 under any label
    /// (Talos writes `ED25519 PRIVATE KEY`).
    ///
    /// # Panics
    /// When the certificate or the key does not parse.
    #[must_use]
    pub fn from_pem(cert_pem: &str, key_pem: &str) -> Self {
        let block = pem::parse(key_pem).expect("the CA key is PEM");
        let key = KeyPair::try_from(block.contents()).expect("the CA key is PKCS#8");
        let kind = if key.algorithm() == &PKCS_ED25519 { KeyKind::Ed25519 } else { KeyKind::EcdsaP256 };
        let issuer = Issuer::from_ca_cert_pem(cert_pem, key).expect("the CA certificate parses");
        Self { cert_pem: cert_pem.to_owned(), kind, issuer }
    }

    /// apid's serving certificate for these names (IP addresses become IP SANs).
    #[must_use]
    pub fn server(&self, names: &[&str]) -> Leaf {
        self.leaf(names, "", ExtendedKeyUsagePurpose::ServerAuth, Validity::Current)
    }

    /// An admin client certificate (organisation `os:admin`), as in a talosconfig.
    #[must_use]
    pub fn admin(&self, validity: Validity) -> Leaf {
        self.leaf(&[], "os:admin", ExtendedKeyUsagePurpose::ClientAuth, validity)
    }

    /// A client certificate of the Talos role `role` (`os:operator`, `os:reader`, ...).
    #[must_use]
    pub fn client(&self, role: &str) -> Leaf {
        self.leaf(&[], role, ExtendedKeyUsagePurpose::ClientAuth, Validity::Current)
    }

    fn leaf(&self, names: &[&str], organisation: &str, usage: ExtendedKeyUsagePurpose, validity: Validity) -> Leaf {
        let key = KeyPair::generate_for(self.kind.algorithm()).expect("a key");
        let mut params =
            CertificateParams::new(names.iter().map(|n| (*n).to_owned()).collect::<Vec<_>>()).expect("params");
        if !organisation.is_empty() {
            params.distinguished_name.push(DnType::OrganizationName, organisation);
        }
        params.extended_key_usages = vec![usage];
        if validity == Validity::Expired {
            params.not_before = date_time_ymd(2020, 1, 1);
            params.not_after = date_time_ymd(2021, 1, 1);
        }
        let cert = params.signed_by(&key, &self.issuer).expect("a signed leaf");
        let pkcs8 = key.serialize_der();
        let talos_key_pem = match self.kind {
            KeyKind::Ed25519 => pem_block("ED25519 PRIVATE KEY", &pkcs8),
            KeyKind::EcdsaP256 => pem_block("EC PRIVATE KEY", &sec1_from_pkcs8_p256(&pkcs8)),
        };
        Leaf { cert_pem: cert.pem(), key_pem: key.serialize_pem(), talos_key_pem }
    }
}

fn pem_block(tag: &str, der: &[u8]) -> String {
    pem::encode_config(&pem::Pem::new(tag, der), pem::EncodeConfig::new().set_line_ending(pem::LineEnding::LF))
}

/// Go's SEC1 encoding of a P-256 key, from ring's PKCS#8: ring's PKCS#8 holds the
/// `ECPrivateKey` without its optional curve parameters (they are in the PKCS#8 algorithm
/// identifier); Go's `MarshalECPrivateKey` writes them as `[0] namedCurve`.
fn sec1_from_pkcs8_p256(pkcs8: &[u8]) -> Vec<u8> {
    // The ECPrivateKey is the PKCS#8 privateKey OCTET STRING, at the end: 04 6d 30 6b ...
    let start = pkcs8.windows(4).position(|w| w == [0x04, 0x6d, 0x30, 0x6b]).expect("ring's P-256 PKCS#8 layout") + 2;
    let inner = &pkcs8[start..];
    assert_eq!(inner.len(), 2 + 0x6b, "the ECPrivateKey runs to the end");
    // version (3 bytes) and privateKey (2 + 32), then publicKey [1] (2 + 68).
    let (head, public) = inner[2..].split_at(3 + 34);
    let named_curve = [0xa0, 0x0a, 0x06, 0x08, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07];
    let body = [head, &named_curve, public].concat();
    let mut der = vec![0x30, u8::try_from(body.len()).expect("a short-form length")];
    der.extend(body);
    der
}

/// A talosconfig as `talosctl gen config` writes it: one context named `context`, the
/// given endpoints and (when any) nodes, and `ca`, `crt`, `key` as base64 of PEM.
#[must_use]
pub fn talosconfig(
    context: &str,
    endpoints: &[String],
    nodes: &[String],
    ca_pem: &str,
    crt_pem: &str,
    key_pem: &str,
) -> String {
    let b64 = |text: &str| base64::engine::general_purpose::STANDARD.encode(text);
    let list = |items: &[String]| items.iter().map(|i| format!("            - {i}\n")).collect::<String>();
    let mut yaml = format!("context: {context}\ncontexts:\n    {context}:\n        endpoints:\n{}", list(endpoints));
    if !nodes.is_empty() {
        yaml.push_str(&format!("        nodes:\n{}", list(nodes)));
    }
    yaml.push_str(&format!(
        "        ca: {}\n        crt: {}\n        key: {}\n",
        b64(ca_pem),
        b64(crt_pem),
        b64(key_pem)
    ));
    yaml
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn talos_key_labels_are_the_ones_talos_writes() {
        let ed = Ca::new(KeyKind::Ed25519).admin(Validity::Current);
        assert!(ed.talos_key_pem.starts_with("-----BEGIN ED25519 PRIVATE KEY-----\n"), "{}", ed.talos_key_pem);
        let ec = Ca::new(KeyKind::EcdsaP256).admin(Validity::Current);
        assert!(ec.talos_key_pem.starts_with("-----BEGIN EC PRIVATE KEY-----\n"), "{}", ec.talos_key_pem);
        let der = pem::parse(&ec.talos_key_pem).unwrap().into_contents();
        assert_eq!(der[..7], [0x30, 0x77, 0x02, 0x01, 0x01, 0x04, 0x20], "SEC1 v1 with a 32-byte key");
        assert_eq!(der.len(), 2 + 0x77);
    }
}
