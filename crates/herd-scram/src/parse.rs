//! Strict parsers for the four SCRAM messages (RFC 5802 section 7). None of
//! them panics: every failure is a [`ScramError`].

use base64::{engine::general_purpose::STANDARD as B64, Engine as _};

use crate::ScramError;

type Result<T> = std::result::Result<T, ScramError>;

/// The GS2 header our client sends: no channel binding, no authzid.
pub(crate) const GS2_NO_BINDING: &str = "n,,";

/// A parsed client-first-message.
#[derive(Debug)]
pub(crate) struct ClientFirst<'a> {
    /// `n,,` or `y,,`.
    pub(crate) gs2_header: &'a str,
    /// The message without the GS2 header.
    pub(crate) bare: &'a str,
    /// Client nonce (`r=`).
    pub(crate) nonce: &'a str,
}

/// A parsed client-final-message.
#[derive(Debug)]
pub(crate) struct ClientFinal<'a> {
    /// Decoded `c=` value.
    pub(crate) channel_binding: Vec<u8>,
    /// Combined nonce (`r=`).
    pub(crate) nonce: &'a str,
    /// The message up to, not including, `,p=...`.
    pub(crate) without_proof: &'a str,
    /// Decoded `p=` value.
    pub(crate) proof: [u8; 32],
}

/// A parsed server-first-message.
#[derive(Debug)]
pub(crate) struct ServerFirst<'a> {
    pub(crate) nonce: &'a str,
    pub(crate) salt: Vec<u8>,
    pub(crate) iterations: u32,
}

/// A parsed server-final-message.
#[derive(Debug)]
pub(crate) enum ServerFinal {
    Verifier([u8; 32]),
    Error(String),
}

fn utf8(msg: &[u8]) -> Result<&str> {
    std::str::from_utf8(msg).map_err(|_| ScramError::Malformed("message is not UTF-8"))
}

/// Value of attribute `name` in `part` (`"<name>=<value>"`), or `what` as the error.
fn attr<'a>(part: &'a str, name: u8, what: &'static str) -> Result<&'a str> {
    match part.as_bytes() {
        [n, b'=', ..] if *n == name => Ok(&part[2..]),
        _ => Err(ScramError::Malformed(what)),
    }
}

/// Checks an optional extension `<letter>=<value>` (RFC 5802 `attr-val`).
fn extension(part: &str) -> Result<()> {
    match part.as_bytes() {
        [b'm', b'=', ..] => Err(ScramError::Malformed("unexpected mandatory extension")),
        [a, b'=', rest @ ..] if a.is_ascii_alphabetic() && !rest.is_empty() => {
            if rest.contains(&0) {
                Err(ScramError::Malformed("NUL in extension value"))
            } else {
                Ok(())
            }
        }
        _ => Err(ScramError::Malformed("bad attribute")),
    }
}

/// `nonce = "r=" c-nonce [s-nonce]`, printable = %x21-2B / %x2D-7E.
fn nonce(value: &str) -> Result<&str> {
    if value.is_empty() {
        return Err(ScramError::Malformed("empty nonce"));
    }
    if !value
        .bytes()
        .all(|b| (0x21..=0x7e).contains(&b) && b != b',')
    {
        return Err(ScramError::Malformed(
            "nonce contains non-printable characters",
        ));
    }
    Ok(value)
}

/// `saslname`: no ',' (already split away), no NUL, '=' only as "=2C" or "=3D".
fn saslname(value: &str) -> Result<()> {
    let b = value.as_bytes();
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            0 => return Err(ScramError::Malformed("NUL in user name")),
            b'=' => {
                match b.get(i + 1..i + 3) {
                    Some(b"2C") | Some(b"3D") => {}
                    _ => return Err(ScramError::Malformed("bad '=' escape in user name")),
                }
                i += 3;
            }
            _ => i += 1,
        }
    }
    Ok(())
}

/// Iteration count: ASCII digits only, no sign, >= 1, fits in u32.
pub(crate) fn parse_iterations(value: &str) -> Option<u32> {
    if value.is_empty() || !value.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    value.parse::<u32>().ok().filter(|&i| i >= 1)
}

/// Canonical padded base64 of exactly 32 bytes.
pub(crate) fn decode_key(value: &str) -> Option<[u8; 32]> {
    let bytes = B64.decode(value).ok()?;
    bytes.try_into().ok()
}

/// `client-first-message = gs2-header client-first-message-bare`.
pub(crate) fn client_first(msg: &[u8]) -> Result<ClientFirst<'_>> {
    let msg = utf8(msg)?;
    let (flag, rest) = msg
        .split_once(',')
        .ok_or(ScramError::Malformed("missing GS2 header"))?;
    match flag {
        "n" | "y" => {}
        f if f.starts_with("p=") => return Err(ScramError::ChannelBindingUnsupported),
        _ => return Err(ScramError::Malformed("bad GS2 channel binding flag")),
    }
    let (authzid, bare) = rest
        .split_once(',')
        .ok_or(ScramError::Malformed("missing GS2 header"))?;
    if !authzid.is_empty() {
        return Err(if authzid.starts_with("a=") {
            ScramError::Malformed("authorization identity is not supported")
        } else {
            ScramError::Malformed("bad GS2 header")
        });
    }
    let gs2_header = &msg[..flag.len() + 2];

    let mut parts = bare.split(',');
    let mut part = parts.next().unwrap_or_default();
    if part.starts_with("m=") {
        return Err(ScramError::Malformed(
            "mandatory extensions are not supported",
        ));
    }
    saslname(attr(part, b'n', "expected user name (n=)")?)?;
    part = parts
        .next()
        .ok_or(ScramError::Malformed("expected nonce (r=)"))?;
    let nonce = nonce(attr(part, b'r', "expected nonce (r=)")?)?;
    for part in parts {
        extension(part)?;
    }
    Ok(ClientFirst {
        gs2_header,
        bare,
        nonce,
    })
}

/// `client-final-message = channel-binding "," nonce ["," extensions] "," proof`.
pub(crate) fn client_final(msg: &[u8]) -> Result<ClientFinal<'_>> {
    let msg = utf8(msg)?;
    let (without_proof, proof) = msg
        .rsplit_once(',')
        .ok_or(ScramError::Malformed("expected client proof (p=)"))?;
    let proof = decode_key(attr(proof, b'p', "expected client proof (p=) last")?).ok_or(
        ScramError::Malformed("client proof is not 32 bytes of base64"),
    )?;

    let mut parts = without_proof.split(',');
    let part = parts.next().unwrap_or_default();
    let channel_binding = B64
        .decode(attr(part, b'c', "expected channel binding (c=)")?)
        .map_err(|_| ScramError::Malformed("channel binding is not base64"))?;
    let part = parts
        .next()
        .ok_or(ScramError::Malformed("expected nonce (r=)"))?;
    let nonce = nonce(attr(part, b'r', "expected nonce (r=)")?)?;
    for part in parts {
        extension(part)?;
    }
    Ok(ClientFinal {
        channel_binding,
        nonce,
        without_proof,
        proof,
    })
}

/// `server-first-message = nonce "," salt "," iteration-count ["," extensions]`.
pub(crate) fn server_first(msg: &[u8]) -> Result<ServerFirst<'_>> {
    let msg = utf8(msg)?;
    let mut parts = msg.split(',');
    let part = parts.next().unwrap_or_default();
    if part.starts_with("m=") {
        return Err(ScramError::Malformed(
            "mandatory extensions are not supported",
        ));
    }
    let nonce = nonce(attr(part, b'r', "expected nonce (r=)")?)?;
    let part = parts
        .next()
        .ok_or(ScramError::Malformed("expected salt (s=)"))?;
    let salt = B64
        .decode(attr(part, b's', "expected salt (s=)")?)
        .map_err(|_| ScramError::Malformed("salt is not base64"))?;
    if salt.is_empty() {
        return Err(ScramError::Malformed("empty salt"));
    }
    let part = parts
        .next()
        .ok_or(ScramError::Malformed("expected iteration count (i=)"))?;
    let iterations = parse_iterations(attr(part, b'i', "expected iteration count (i=)")?)
        .ok_or(ScramError::Malformed("bad iteration count"))?;
    for part in parts {
        extension(part)?;
    }
    Ok(ServerFirst {
        nonce,
        salt,
        iterations,
    })
}

/// `server-final-message = (server-error / verifier) ["," extensions]`.
pub(crate) fn server_final(msg: &[u8]) -> Result<ServerFinal> {
    let msg = utf8(msg)?;
    let mut parts = msg.split(',');
    let part = parts.next().unwrap_or_default();
    let result = match part.as_bytes() {
        [b'e', b'=', rest @ ..] => {
            if rest.is_empty() || rest.contains(&0) {
                return Err(ScramError::Malformed("bad server error value"));
            }
            ServerFinal::Error(part[2..].to_owned())
        }
        [b'v', b'=', ..] => ServerFinal::Verifier(decode_key(&part[2..]).ok_or(
            ScramError::Malformed("server signature is not 32 bytes of base64"),
        )?),
        _ => {
            return Err(ScramError::Malformed(
                "expected server signature (v=) or error (e=)",
            ))
        }
    };
    for part in parts {
        extension(part)?;
    }
    Ok(result)
}
