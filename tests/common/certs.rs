//! A throwaway CA with server and client certificates.

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};
use std::path::PathBuf;

/// A CA, a server certificate for `localhost` and a client certificate, as PEM files.
pub struct Certificates {
    dir: tempfile::TempDir,
}

impl Certificates {
    pub fn make() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let write = |name: &str, pem: String| std::fs::write(dir.path().join(name), pem).unwrap();

        let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.distinguished_name
            .push(DnType::CommonName, "svcgate test CA");
        ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let ca = CertifiedIssuer::self_signed(ca, KeyPair::generate().unwrap()).unwrap();
        write("ca.pem", ca.pem());

        for (name, sans, purpose) in [
            (
                "server",
                vec!["localhost".to_string()],
                ExtendedKeyUsagePurpose::ServerAuth,
            ),
            ("client", Vec::new(), ExtendedKeyUsagePurpose::ClientAuth),
        ] {
            let key = KeyPair::generate().unwrap();
            let mut params = CertificateParams::new(sans).unwrap();
            params
                .distinguished_name
                .push(DnType::CommonName, format!("svcgate test {name}"));
            params.extended_key_usages = vec![purpose];
            let cert = params.signed_by(&key, &ca).unwrap();
            write(&format!("{name}.pem"), cert.pem());
            write(&format!("{name}.key"), key.serialize_pem());
        }
        Self { dir }
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
}
