//! Fresh certificates for one control plane: a CA, the API server's serving certificate, client
//! certificates per component, and the service-account signing key. ECDSA P-256 keys: made in
//! microseconds, and every component accepts them.

use std::io::Write;
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

use super::LaunchError;

/// Who a client certificate speaks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Identity {
    /// `system:masters`: everything.
    Admin,
    /// `system:kube-controller-manager`.
    ControllerManager,
    /// `system:kube-scheduler`.
    Scheduler,
    /// `system:masters` too, under a name of its own: the API server writes an audit record of
    /// each of its requests (see [`super::audit`]).
    Audited,
}

impl Identity {
    /// The stem of its certificate's, key's and kubeconfig's file names, and its certificate's
    /// common name and organization.
    fn names(self) -> (&'static str, &'static str, Option<&'static str>) {
        let masters = Some("system:masters");
        match self {
            Identity::Admin => ("admin", "ttdp-test-admin", masters),
            Identity::ControllerManager => (
                "kube-controller-manager",
                "system:kube-controller-manager",
                None,
            ),
            Identity::Scheduler => ("kube-scheduler", "system:kube-scheduler", None),
            Identity::Audited => ("audited", super::audit::AUDITED_USER, masters),
        }
    }
}

/// The written files of one control plane's PKI.
#[derive(Debug)]
pub(super) struct Pki {
    dir: PathBuf,
}

impl Pki {
    /// Makes every certificate and key under `dir`; the serving certificate also names
    /// `extra_names` (addresses or DNS names), and `kubelet-client.crt` is what the API server
    /// shows a kubelet.
    pub(super) fn write(dir: &Path, extra_names: &[String]) -> Result<Pki, LaunchError> {
        std::fs::create_dir_all(dir).map_err(LaunchError::io(dir.display()))?;
        let pki = Pki {
            dir: dir.to_path_buf(),
        };
        let ca_key = KeyPair::generate()?;
        let mut ca = params(Vec::new(), "ttdp-test-ca")?;
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let ca_cert = ca.self_signed(&ca_key)?;
        pki.put("ca.crt", &ca_cert.pem())?;
        pki.put("ca.key", &ca_key.serialize_pem())?;
        let issuer = Issuer::new(ca, ca_key);

        let names = [
            "127.0.0.1",
            "localhost",
            "kubernetes",
            "kubernetes.default.svc",
        ];
        let mut names = names.map(String::from).to_vec();
        names.extend_from_slice(extra_names);
        let mut serving = params(names, "kube-apiserver")?;
        serving.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        pki.signed("serving", &serving, &issuer)?;

        let mut kubelet_client = params(Vec::new(), "kube-apiserver-kubelet-client")?;
        kubelet_client
            .distinguished_name
            .push(DnType::OrganizationName, "system:masters");
        kubelet_client.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        pki.signed("kubelet-client", &kubelet_client, &issuer)?;

        for identity in [
            Identity::Admin,
            Identity::ControllerManager,
            Identity::Scheduler,
            Identity::Audited,
        ] {
            let (stem, common_name, organization) = identity.names();
            let mut client = params(Vec::new(), common_name)?;
            if let Some(organization) = organization {
                client
                    .distinguished_name
                    .push(DnType::OrganizationName, organization);
            }
            client.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
            pki.signed(stem, &client, &issuer)?;
        }

        let service_accounts = KeyPair::generate()?;
        pki.put("sa.key", &service_accounts.serialize_pem())?;
        pki.put("sa.pub", &service_accounts.public_key_pem())?;
        Ok(pki)
    }

    /// The path of one written file (`ca.crt`, `serving.key`, `sa.pub`, ...).
    pub(super) fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// Writes `<dir>/<stem>.kubeconfig` for `identity` against `server`, `stem` being its
    /// [`Identity::names`].
    pub(super) fn write_kubeconfig(
        &self,
        dir: &Path,
        server: &str,
        identity: Identity,
    ) -> Result<PathBuf, LaunchError> {
        let (user, ..) = identity.names();
        let user_entry = format!(
            "    client-certificate: {}\n    client-key: {}\n",
            self.path(&format!("{user}.crt")).display(),
            self.path(&format!("{user}.key")).display()
        );
        let ca = self.path("ca.crt");
        write_kubeconfig(dir, user, server, ServerTrust::CaFile(&ca), &user_entry)
    }

    fn signed(
        &self,
        stem: &str,
        params: &CertificateParams,
        issuer: &Issuer<'_, KeyPair>,
    ) -> Result<(), LaunchError> {
        let key = KeyPair::generate()?;
        let cert = params.signed_by(&key, issuer)?;
        self.put(&format!("{stem}.crt"), &cert.pem())?;
        self.put(&format!("{stem}.key"), &key.serialize_pem())
    }

    fn put(&self, name: &str, contents: &str) -> Result<(), LaunchError> {
        let path = self.path(name);
        std::fs::write(&path, contents).map_err(LaunchError::io(path.display()))
    }
}

/// Certificate parameters for the subject alternative `names`, with `common_name`.
fn params(names: Vec<String>, common_name: &str) -> Result<CertificateParams, rcgen::Error> {
    let mut params = CertificateParams::new(names)?;
    params
        .distinguished_name
        .push(DnType::CommonName, common_name);
    Ok(params)
}

/// How a kubeconfig's cluster entry trusts the API server's certificate.
#[derive(Debug, Clone, Copy)]
pub(crate) enum ServerTrust<'a> {
    /// `certificate-authority`: a PEM file.
    CaFile(&'a Path),
    /// `certificate-authority-data`: the base64 of a PEM bundle, as another kubeconfig holds it.
    CaData(&'a str),
    /// Nothing: plain HTTP on loopback (the imitation server, the fault proxy).
    PlainHttp,
}

/// Writes `<dir>/<stem>.kubeconfig` (see [`kubeconfig_text`]).
pub(super) fn write_kubeconfig(
    dir: &Path,
    stem: &str,
    server: &str,
    trust: ServerTrust<'_>,
    user_entry: &str,
) -> Result<PathBuf, LaunchError> {
    let path = dir.join(format!("{stem}.kubeconfig"));
    let text = kubeconfig_text(stem, server, trust, user_entry);
    std::fs::write(&path, text).map_err(LaunchError::io(path.display()))?;
    Ok(path)
}

/// A temporary kubeconfig (removed when dropped) naming `url` over plain HTTP on loopback,
/// without credentials: the imitation server's and the fault proxy's.
pub(crate) fn plain_http_kubeconfig(url: &str) -> std::io::Result<tempfile::NamedTempFile> {
    let text = kubeconfig_text("ttdp-test", url, ServerTrust::PlainHttp, "    {}\n");
    let mut file = tempfile::Builder::new()
        .prefix("ttdp-")
        .suffix(".kubeconfig")
        .tempfile()?;
    file.write_all(text.as_bytes())?;
    Ok(file)
}

/// A kubeconfig of one cluster (`server`, trusted as `trust` says), one user `stem` whose
/// indented entry is `user_entry` (`    {}\n` for no credentials), and a context `ttdp-test`
/// joining them, with namespace `default`.
fn kubeconfig_text(stem: &str, server: &str, trust: ServerTrust<'_>, user_entry: &str) -> String {
    let trust = match trust {
        ServerTrust::CaFile(ca) => format!("    certificate-authority: {}\n", ca.display()),
        ServerTrust::CaData(data) => format!("    certificate-authority-data: {data}\n"),
        ServerTrust::PlainHttp => String::new(),
    };
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: ttdp-test\n  cluster:\n    \
         server: {server}\n{trust}users:\n- name: {stem}\n  user:\n\
         {user_entry}contexts:\n- name: ttdp-test\n  context:\n    cluster: ttdp-test\n    \
         user: {stem}\n    namespace: default\ncurrent-context: ttdp-test\n"
    )
}
