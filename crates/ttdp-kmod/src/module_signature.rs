//! Reading module signatures and signing certificates, without OpenSSL: the few DER structures
//! that say who signed a module and which certificate that is.
//!
//! A signed module is the module, a PKCS#7 `SignedData` (DER, content detached), a 12-byte
//! `struct module_signature` (its last 4 bytes the PKCS#7 length, big-endian) and the marker
//! `~Module signature appended~\n`. The PKCS#7 names its signer by the certificate's issuer and
//! serial number, which is also how the kernel finds the key to check it with. `modinfo` shows
//! the issuer's common name as `signer` and the serial number as `sig_key`; so does
//! [`ModuleSigner`].
//!
//! The kernel describes each X.509 key it holds as `<subject name>: <key id>`, the key id being
//! the certificate's subject key identifier (hex), else its serial number: [`CertificateId`]
//! computes that id, so the keys the kernel lists (`/proc/keys`) can be searched for it.

/// The marker the kernel's `sign-file` appends to a signed module.
pub(crate) const SIGNATURE_MARKER: &[u8] = b"~Module signature appended~\n";
/// `struct module_signature`: algo, hash, id type, signer and key id lengths, 3 bytes of padding,
/// then the signature's length (big-endian u32).
const SIGNATURE_INFO_LEN: usize = 12;
/// `id_type` of a PKCS#7 signature (`PKEY_ID_PKCS7`).
const PKEY_ID_PKCS7: u8 = 2;
/// OID 2.5.4.3, commonName.
const OID_COMMON_NAME: &[u8] = &[0x55, 0x04, 0x03];
/// OID 2.5.29.14, subjectKeyIdentifier.
const OID_SUBJECT_KEY_ID: &[u8] = &[0x55, 0x1d, 0x0e];

/// Who signed a module, as the PKCS#7 appended to it names the certificate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModuleSigner {
    /// The certificate issuer's common name: what `modinfo` shows as `signer`.
    pub name: String,
    /// The certificate's serial number as `modinfo` shows `sig_key`: hex bytes, upper case,
    /// separated by colons.
    pub key: String,
    /// The issuer's DER-encoded name (with the serial number, the certificate's identity).
    issuer_der: Vec<u8>,
    /// The serial number's DER content bytes.
    serial: Vec<u8>,
}

impl ModuleSigner {
    /// Whether `cert` is the certificate this signer names (same issuer and serial number).
    pub fn is(&self, cert: &CertificateId) -> bool {
        self.issuer_der == cert.issuer_der && self.serial == cert.serial
    }
}

/// A module file split into its content and its appended signature.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AppendedSignature {
    /// The length of the module without the signature (what was signed).
    pub content_len: usize,
    /// The PKCS#7 `SignedData`, DER.
    pub pkcs7: Vec<u8>,
    /// Who signed it.
    pub signer: ModuleSigner,
}

/// The appended signature of the module image `bytes`: `Ok(None)` when it has none, an error
/// saying what is wrong when the signature block is malformed.
pub fn appended_signature(bytes: &[u8]) -> Result<Option<AppendedSignature>, String> {
    let Some(rest) = bytes.strip_suffix(SIGNATURE_MARKER) else {
        return Ok(None);
    };
    let info_at = rest
        .len()
        .checked_sub(SIGNATURE_INFO_LEN)
        .ok_or("signature block shorter than its header")?;
    let info = &rest[info_at..];
    if info[2] != PKEY_ID_PKCS7 {
        return Err(format!("signature of id type {}, not PKCS#7 (2)", info[2]));
    }
    let sig_len = usize::try_from(u32::from_be_bytes([info[8], info[9], info[10], info[11]]))
        .map_err(|e| e.to_string())?;
    let content_len = info_at
        .checked_sub(sig_len)
        .ok_or("signature longer than the file")?;
    let pkcs7 = rest[content_len..info_at].to_vec();
    let signer = pkcs7_signer(&pkcs7)?;
    Ok(Some(AppendedSignature {
        content_len,
        pkcs7,
        signer,
    }))
}

/// The module image `bytes` without its appended signature (all of it when unsigned or when the
/// signature block cannot be read).
pub fn unsigned_content(bytes: &[u8]) -> &[u8] {
    match appended_signature(bytes) {
        Ok(Some(signature)) => &bytes[..signature.content_len],
        _ => bytes,
    }
}

/// The identity of an X.509 certificate: what signatures and the kernel's key list name it by.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertificateId {
    /// The subject's common name (empty without one).
    pub subject_name: String,
    /// The issuer's common name: what `modinfo` shows as `signer` of a module it signed.
    pub issuer_name: String,
    /// The serial number as `modinfo` shows `sig_key`.
    pub serial_text: String,
    /// The id the kernel gives its key: the subject key identifier (lower-case hex), else the
    /// serial number.
    pub kernel_key_id: String,
    issuer_der: Vec<u8>,
    serial: Vec<u8>,
}

impl CertificateId {
    /// Reads a certificate in PEM (the first `CERTIFICATE` block) or DER.
    pub fn parse(bytes: &[u8]) -> Result<Self, String> {
        let der = if bytes.starts_with(&[0x30]) {
            bytes.to_vec()
        } else {
            pem_certificate(bytes)?
        };
        Self::from_der(&der)
    }

    fn from_der(der: &[u8]) -> Result<Self, String> {
        let (cert, _) = Der::read(der, 0x30)?;
        let (tbs, _) = Der::read(cert.content, 0x30)?;
        let mut fields = tbs.content;
        if fields.first() == Some(&0xa0) {
            fields = Der::read(fields, 0xa0)?.1; // [0] version
        }
        let (serial, rest) = Der::read(fields, 0x02)?;
        let (_, rest) = Der::read(rest, 0x30)?; // signature algorithm
        let (issuer, rest) = Der::read(rest, 0x30)?;
        let (_, rest) = Der::read(rest, 0x30)?; // validity
        let (subject, rest) = Der::read(rest, 0x30)?;
        let (_, rest) = Der::read(rest, 0x30)?; // subject public key info
        let skid = subject_key_id(rest)?;
        Ok(Self {
            subject_name: common_name(subject.content)?.unwrap_or_default(),
            issuer_name: common_name(issuer.content)?.unwrap_or_default(),
            serial_text: colon_hex(serial.content),
            kernel_key_id: hex::encode(skid.unwrap_or(serial.content)),
            issuer_der: issuer.whole.to_vec(),
            serial: serial.content.to_vec(),
        })
    }
}

/// The signer named by the first `SignerInfo` of a PKCS#7 `ContentInfo` holding `SignedData`.
fn pkcs7_signer(pkcs7: &[u8]) -> Result<ModuleSigner, String> {
    let bad = |what: &str| format!("module signature is not PKCS#7 SignedData: {what}");
    let (content_info, _) = Der::read(pkcs7, 0x30).map_err(|e| bad(&e))?;
    let (_, rest) = Der::read(content_info.content, 0x06).map_err(|e| bad(&e))?;
    let (explicit, _) = Der::read(rest, 0xa0).map_err(|e| bad(&e))?;
    let (signed_data, _) = Der::read(explicit.content, 0x30).map_err(|e| bad(&e))?;
    let (_, rest) = Der::read(signed_data.content, 0x02).map_err(|e| bad(&e))?; // version
    let (_, rest) = Der::read(rest, 0x31).map_err(|e| bad(&e))?; // digest algorithms
    let (_, mut rest) = Der::read(rest, 0x30).map_err(|e| bad(&e))?; // content info
    for optional in [0xa0, 0xa1] {
        // certificates [0] and CRLs [1], which sign-file leaves out
        if rest.first() == Some(&optional) {
            rest = Der::read(rest, optional).map_err(|e| bad(&e))?.1;
        }
    }
    let (signer_infos, _) = Der::read(rest, 0x31).map_err(|e| bad(&e))?;
    let (signer_info, _) = Der::read(signer_infos.content, 0x30).map_err(|e| bad(&e))?;
    let (_, rest) = Der::read(signer_info.content, 0x02).map_err(|e| bad(&e))?; // version
    let (issuer_and_serial, _) = Der::read(rest, 0x30)
        .map_err(|_| bad("the signer is not named by issuer and serial number"))?;
    let (issuer, rest) = Der::read(issuer_and_serial.content, 0x30).map_err(|e| bad(&e))?;
    let (serial, _) = Der::read(rest, 0x02).map_err(|e| bad(&e))?;
    Ok(ModuleSigner {
        name: common_name(issuer.content)?.unwrap_or_default(),
        key: colon_hex(serial.content),
        issuer_der: issuer.whole.to_vec(),
        serial: serial.content.to_vec(),
    })
}

/// The first commonName in the content of an X.501 `Name` (a SEQUENCE of SETs of
/// `AttributeTypeAndValue`).
fn common_name(mut name: &[u8]) -> Result<Option<String>, String> {
    while !name.is_empty() {
        let (set, rest) = Der::read(name, 0x31)?;
        name = rest;
        let mut attributes = set.content;
        while !attributes.is_empty() {
            let (attribute, rest) = Der::read(attributes, 0x30)?;
            attributes = rest;
            let (oid, value) = Der::read(attribute.content, 0x06)?;
            if oid.content == OID_COMMON_NAME {
                let (text, _) = Der::any(value)?;
                return Ok(Some(String::from_utf8_lossy(text.content).into_owned()));
            }
        }
    }
    Ok(None)
}

/// The subject key identifier among the `[3]` extensions after the public key, if any.
fn subject_key_id(mut rest: &[u8]) -> Result<Option<&[u8]>, String> {
    while !rest.is_empty() {
        let (field, after) = Der::any(rest)?;
        rest = after;
        if field.tag != 0xa3 {
            continue;
        }
        let (extensions, _) = Der::read(field.content, 0x30)?;
        let mut list = extensions.content;
        while !list.is_empty() {
            let (extension, after) = Der::read(list, 0x30)?;
            list = after;
            let (oid, mut value) = Der::read(extension.content, 0x06)?;
            if value.first() == Some(&0x01) {
                value = Der::read(value, 0x01)?.1; // critical
            }
            if oid.content == OID_SUBJECT_KEY_ID {
                let (wrapped, _) = Der::read(value, 0x04)?;
                let (key_id, _) = Der::read(wrapped.content, 0x04)?;
                return Ok(Some(key_id.content));
            }
        }
    }
    Ok(None)
}

/// `01:AB:...`, as `modinfo` prints a serial number.
fn colon_hex(bytes: &[u8]) -> String {
    let hex = hex::encode_upper(bytes);
    let pairs: Vec<&str> = (0..hex.len())
        .step_by(2)
        .filter_map(|i| hex.get(i..i + 2))
        .collect();
    pairs.join(":")
}

/// One DER element: its tag, its content and all of its bytes.
struct Der<'a> {
    tag: u8,
    content: &'a [u8],
    whole: &'a [u8],
}

impl<'a> Der<'a> {
    /// The element at the start of `bytes` (any tag, single-byte tags only) and what follows it.
    fn any(bytes: &'a [u8]) -> Result<(Self, &'a [u8]), String> {
        let tag = *bytes.first().ok_or("DER element expected, found the end")?;
        let first = *bytes.get(1).ok_or("DER length missing")?;
        let (len, header) = if first < 0x80 {
            (usize::from(first), 2)
        } else {
            let count = usize::from(first & 0x7f);
            if count == 0 || count > 4 {
                return Err(format!("DER length of {count} bytes not supported"));
            }
            let digits = bytes.get(2..2 + count).ok_or("DER length truncated")?;
            let len = digits
                .iter()
                .fold(0usize, |acc, b| (acc << 8) | usize::from(*b));
            (len, 2 + count)
        };
        let end = header
            .checked_add(len)
            .filter(|end| *end <= bytes.len())
            .ok_or("DER element longer than its container")?;
        Ok((
            Self {
                tag,
                content: &bytes[header..end],
                whole: &bytes[..end],
            },
            &bytes[end..],
        ))
    }

    /// [`Der::any`], requiring tag `tag`.
    fn read(bytes: &'a [u8], tag: u8) -> Result<(Self, &'a [u8]), String> {
        let (element, rest) = Self::any(bytes)?;
        if element.tag != tag {
            return Err(format!(
                "DER tag {:#04x} where {tag:#04x} was expected",
                element.tag
            ));
        }
        Ok((element, rest))
    }
}

/// The DER of the first `CERTIFICATE` block of a PEM file.
fn pem_certificate(pem: &[u8]) -> Result<Vec<u8>, String> {
    let text = String::from_utf8_lossy(pem);
    let body = text
        .split("-----BEGIN CERTIFICATE-----")
        .nth(1)
        .and_then(|after| after.split("-----END CERTIFICATE-----").next())
        .ok_or("no PEM CERTIFICATE block and not DER")?;
    base64_decode(body)
}

/// Standard base64 (padding and whitespace ignored).
fn base64_decode(text: &str) -> Result<Vec<u8>, String> {
    let value = |c: u8| -> Result<u32, String> {
        match c {
            b'A'..=b'Z' => Ok(u32::from(c - b'A')),
            b'a'..=b'z' => Ok(u32::from(c - b'a') + 26),
            b'0'..=b'9' => Ok(u32::from(c - b'0') + 52),
            b'+' => Ok(62),
            b'/' => Ok(63),
            _ => Err(format!("invalid base64 character {:?}", char::from(c))),
        }
    };
    let mut out = Vec::with_capacity(text.len() * 3 / 4);
    let (mut bits, mut count) = (0u32, 0u32);
    for c in text
        .bytes()
        .filter(|c| !c.is_ascii_whitespace() && *c != b'=')
    {
        bits = (bits << 6) | value(c)?;
        count += 6;
        if count >= 8 {
            count -= 8;
            out.push(((bits >> count) & 0xff) as u8);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_and_colon_hex_read_like_their_tools() {
        assert_eq!(base64_decode("aGVsbG8=\n").unwrap(), b"hello");
        assert_eq!(base64_decode("YWJj").unwrap(), b"abc");
        assert!(base64_decode("a*").is_err());
        assert_eq!(colon_hex(&[0x01, 0xab, 0x0f]), "01:AB:0F");
    }

    #[test]
    fn unsigned_and_malformed_signature_blocks_are_told_apart() {
        assert_eq!(appended_signature(b"\x7fELF plain module").unwrap(), None);
        let mut short = b"x".to_vec();
        short.extend_from_slice(SIGNATURE_MARKER);
        assert!(appended_signature(&short).is_err());
        let mut wrong_type = vec![0u8; 40];
        wrong_type.extend_from_slice(&[0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 4]);
        wrong_type.extend_from_slice(SIGNATURE_MARKER);
        let err = appended_signature(&wrong_type).unwrap_err();
        assert!(err.contains("not PKCS#7"), "{err}");
        assert_eq!(unsigned_content(&wrong_type), &wrong_type[..]);
    }
}
