//! Certificates for the TLS tests, made by each test with rcgen: a CA, a server certificate for
//! 127.0.0.1 and localhost and a client certificate signed by it, and an unrelated CA, as PEM
//! files in a temporary directory deleted with the [`Pki`]. The TLS tests (tests/e2e/tls.rs)
//! and the chaos suite's TLS plans (a RabbitMQ cluster and PostgreSQL with TLS on) use them.

use std::path::PathBuf;

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};

/// PEM files made for one test, deleted with it.
pub struct Pki {
    dir: tempfile::TempDir,
}

impl Pki {
    /// A CA, a server certificate for 127.0.0.1 and localhost and a client certificate signed
    /// by it, and another CA that signed nothing here.
    pub fn generate() -> Pki {
        let dir = tempfile::Builder::new()
            .prefix("chime-tls-")
            .tempdir()
            .expect("temporary directory");
        let write = |name: &str, pem: String| {
            std::fs::write(dir.path().join(name), pem).expect("writing a PEM file");
        };
        let ca = certificate_authority("Chime test CA");
        write("ca.pem", ca.pem());
        write("other-ca.pem", certificate_authority("Another CA").pem());
        for (name, sans, usage) in [
            (
                "server",
                vec!["127.0.0.1".to_owned(), "localhost".to_owned()],
                ExtendedKeyUsagePurpose::ServerAuth,
            ),
            ("client", Vec::new(), ExtendedKeyUsagePurpose::ClientAuth),
        ] {
            let key = KeyPair::generate().expect("key pair");
            let mut params = CertificateParams::new(sans).expect("certificate parameters");
            params
                .distinguished_name
                .push(DnType::CommonName, format!("chime-test-{name}"));
            params.extended_key_usages = vec![usage];
            let cert = params.signed_by(&key, &ca).expect("signing");
            write(&format!("{name}.pem"), cert.pem());
            write(&format!("{name}.key"), key.serialize_pem());
        }
        Pki { dir }
    }

    /// `name` in the PKI's directory: `ca.pem`, `other-ca.pem`, `server.pem`, `server.key`,
    /// `client.pem`, `client.key`.
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
}

fn certificate_authority(name: &str) -> CertifiedIssuer<'static, KeyPair> {
    let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA parameters");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    CertifiedIssuer::self_signed(params, KeyPair::generate().expect("CA key")).expect("CA")
}
