#![allow(clippy::unwrap_used)]

use base64::{engine::general_purpose::STANDARD as B64, Engine as _};
use rand::{rngs::StdRng, Rng, SeedableRng};

use crate::*;

// RFC 7677 section 3.
const RFC_CLIENT_FIRST: &str = "n,,n=user,r=rOprNGfwEbeRWgbNEkqO";
const RFC_SERVER_FIRST: &str =
    "r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096";
const RFC_CLIENT_FINAL: &str = "c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,\
                                p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=";
const RFC_SERVER_FINAL: &str = "v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=";

fn rfc_verifier() -> Verifier {
    let salt = B64.decode("W22ZaJ0SNY7soEsUEjb6gQ==").unwrap();
    Verifier::from_password("pencil", &salt, 4096)
}

/// A verifier cheap to derive (few iterations) for the many table tests.
fn quick_verifier(password: &str) -> Verifier {
    Verifier::from_password(password, b"quick-salt", 2)
}

/// Runs a full exchange; returns the server's recovered key or the first error.
fn handshake(
    client: &mut ClientExchange,
    server: &mut ServerExchange,
) -> Result<ClientKey, ScramError> {
    let first = client.client_first();
    let server_first = server.server_first(&first)?;
    let client_final = client.client_final(&server_first)?;
    let (server_final, key) = server.server_final(&client_final)?;
    client.verify_server_final(&server_final)?;
    Ok(key)
}

fn to_str(b: Vec<u8>) -> String {
    String::from_utf8(b).unwrap()
}

#[test]
fn rfc7677_client_side() {
    let mut client = ClientExchange::with_password("pencil").fixed("user", "rOprNGfwEbeRWgbNEkqO");
    assert_eq!(to_str(client.client_first()), RFC_CLIENT_FIRST);
    let client_final = client.client_final(RFC_SERVER_FIRST.as_bytes()).unwrap();
    assert_eq!(to_str(client_final), RFC_CLIENT_FINAL);
    client
        .verify_server_final(RFC_SERVER_FINAL.as_bytes())
        .unwrap();
    assert_eq!(
        client.verify_server_final(b"v=AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA="),
        Err(ScramError::ServerSignatureMismatch)
    );
    assert_eq!(client.server_key(), Some(rfc_verifier().server_key()));
    assert!(client.client_key().unwrap().matches(&rfc_verifier()));
}

#[test]
fn rfc7677_server_side() {
    let mut server =
        ServerExchange::with_fixed_nonce(rfc_verifier(), "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0");
    let server_first = server.server_first(RFC_CLIENT_FIRST.as_bytes()).unwrap();
    assert_eq!(to_str(server_first), RFC_SERVER_FIRST);
    let (server_final, key) = server.server_final(RFC_CLIENT_FINAL.as_bytes()).unwrap();
    assert_eq!(to_str(server_final), RFC_SERVER_FINAL);
    let expected = crypto::Keys::from_password(b"pencil", &rfc_verifier().salt, 4096).client_key;
    assert_eq!(key, expected);
}

#[test]
fn rfc7677_client_key_side() {
    // The pass-through client reproduces the RFC proof from the ClientKey alone.
    let key = crypto::Keys::from_password(b"pencil", &rfc_verifier().salt, 4096).client_key;
    let mut client =
        ClientExchange::with_verifier(key, &rfc_verifier()).fixed("user", "rOprNGfwEbeRWgbNEkqO");
    assert_eq!(to_str(client.client_first()), RFC_CLIENT_FIRST);
    let client_final = client.client_final(RFC_SERVER_FIRST.as_bytes()).unwrap();
    assert_eq!(to_str(client_final), RFC_CLIENT_FINAL);
    client
        .verify_server_final(RFC_SERVER_FINAL.as_bytes())
        .unwrap();
}

#[test]
fn pbkdf2_matches_rfc7914_vector() {
    // RFC 7914 section 11, PBKDF2-HMAC-SHA256 (P="passwd", S="salt", c=1), first 32 bytes.
    let out = crypto::salted_password(b"passwd", b"salt", 1);
    let hex: String = out.iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(
        hex,
        "55ac046e56e3089fec1691c22544b605f94185216dde0465e68b9d57c20dacbc"
    );
}

#[test]
fn password_round_trip_recovers_client_key() {
    let verifier = Verifier::generate("s3cret pass");
    let mut client = ClientExchange::with_password("s3cret pass");
    let mut server = ServerExchange::new(verifier.clone());
    let key = handshake(&mut client, &mut server).unwrap();
    let expected =
        crypto::Keys::from_password(b"s3cret pass", verifier.salt(), verifier.iterations())
            .client_key;
    assert_eq!(key, expected);
    assert_eq!(client.client_key(), Some(&expected));
    assert!(key.matches(&verifier));
}

#[test]
fn wrong_password_fails() {
    let verifier = quick_verifier("right");
    let mut client = ClientExchange::with_password("wrong");
    let mut server = ServerExchange::new(verifier);
    assert_eq!(
        handshake(&mut client, &mut server),
        Err(ScramError::AuthFailed)
    );
    // The exchange is over.
    assert!(matches!(
        server.server_final(b"c=biws,r=x,p=AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA="),
        Err(ScramError::InvalidState(_))
    ));
}

#[test]
fn recovered_key_passes_through() {
    let verifier = Verifier::from_password("pass-through", b"0123456789abcdef", 4096);
    let mut server = ServerExchange::new(verifier.clone());
    let key = handshake(
        &mut ClientExchange::with_password("pass-through"),
        &mut server,
    )
    .unwrap();

    // With the ServerKey: both sides authenticated.
    let mut client = ClientExchange::with_client_key(key.clone(), Some(*verifier.server_key()));
    assert!(client.can_verify_server());
    let again = handshake(&mut client, &mut ServerExchange::new(verifier.clone())).unwrap();
    assert_eq!(again, key);

    // Checked against the whole verifier.
    let mut client = ClientExchange::with_verifier(key.clone(), &verifier);
    handshake(&mut client, &mut ServerExchange::new(verifier.clone())).unwrap();

    // Without the ServerKey: works, but the server is not authenticated.
    let mut client = ClientExchange::with_client_key(key.clone(), None);
    assert!(!client.can_verify_server());
    handshake(&mut client, &mut ServerExchange::new(verifier.clone())).unwrap();

    // An impostor server (other verifier, same salt) is detected...
    let impostor = Verifier::from_parts(
        verifier.iterations(),
        verifier.salt().to_vec(),
        *verifier.stored_key(),
        [7; 32],
    )
    .unwrap();
    let mut client = ClientExchange::with_client_key(key.clone(), Some(*verifier.server_key()));
    assert_eq!(
        handshake(&mut client, &mut ServerExchange::new(impostor)),
        Err(ScramError::ServerSignatureMismatch)
    );

    // ...and a changed password on the server too.
    let changed = Verifier::from_password("new password", b"another salt", 4096);
    let mut client = ClientExchange::with_verifier(key.clone(), &verifier);
    assert_eq!(
        handshake(&mut client, &mut ServerExchange::new(changed.clone())),
        Err(ScramError::VerifierMismatch)
    );
    let mut client = ClientExchange::with_client_key(key, Some(*verifier.server_key()));
    assert_eq!(
        handshake(&mut client, &mut ServerExchange::new(changed)),
        Err(ScramError::AuthFailed)
    );
}

#[test]
fn verifier_round_trip_and_literal() {
    let v = Verifier::from_password("secret", b"saltsaltsalt", 4096);
    // Computed independently (Python hashlib.pbkdf2_hmac + hmac).
    let literal = "SCRAM-SHA-256$4096:c2FsdHNhbHRzYWx0$\
                   UdmKRUjfgm0U6mfMFFn/tGaEoriNY2YlrUES5w+4kaA=:\
                   ZH6upP+u0RFc4kNZYflxg+txwr3oIlzDM/JXePM5XCY=";
    assert_eq!(v.to_string(), literal);
    assert_eq!(Verifier::parse(literal).unwrap(), v);
    assert_eq!(literal.parse::<Verifier>().unwrap(), v);
    assert_eq!(Verifier::parse(&v.to_string()).unwrap(), v);
    let ck = ClientKey::from_bytes(
        B64.decode("X9SvgJs2JMe0QP+0iXU5WIwbK7DFPW5nQ83D6ztXww4=")
            .unwrap()
            .try_into()
            .unwrap(),
    );
    assert!(ck.matches(&v));

    let g = Verifier::generate("secret");
    assert_eq!(g.salt().len(), DEFAULT_SALT_LEN);
    assert_eq!(g.iterations(), DEFAULT_ITERATIONS);
    assert_eq!(Verifier::parse(&g.to_string()).unwrap(), g);
}

#[test]
fn bad_verifiers() {
    let key = "UdmKRUjfgm0U6mfMFFn/tGaEoriNY2YlrUES5w+4kaA=";
    let key31 = B64.encode([1u8; 31]);
    let cases = [
        String::new(),
        "md5a3556571e93b0d20722ba62be61e8c2d".into(),
        "SCRAM-SHA-256$".into(),
        "SCRAM-SHA-256$4096:c2FsdA==".into(),
        "SCRAM-SHA-256$4096:c2FsdA==$".into(),
        format!("SCRAM-SHA-256$4096:c2FsdA==${key}"),
        format!("SCRAM-SHA-256$4096:c2FsdA==${key}:"),
        format!("SCRAM-SHA-256$0:c2FsdA==${key}:{key}"),
        format!("SCRAM-SHA-256$-1:c2FsdA==${key}:{key}"),
        format!("SCRAM-SHA-256$+4096:c2FsdA==${key}:{key}"),
        format!("SCRAM-SHA-256$4294967296:c2FsdA==${key}:{key}"),
        format!("SCRAM-SHA-256$:c2FsdA==${key}:{key}"),
        format!("SCRAM-SHA-256$4096:${key}:{key}"),
        format!("SCRAM-SHA-256$4096:c2FsdA${key}:{key}"),
        format!("SCRAM-SHA-256$4096:c2FsdA=!${key}:{key}"),
        format!("SCRAM-SHA-256$4096:c2FsdA==${key31}:{key}"),
        format!("SCRAM-SHA-256$4096:c2FsdA==${key}:{key31}"),
        format!("SCRAM-SHA-256$4096:c2FsdA==${key}:{key}:"),
        format!("SCRAM-SHA-256$4096:c2FsdA==${key}:{key}$"),
        format!("SCRAM-SHA-256$4096:c2FsdA==$ {key}:{key}"),
        format!("SCRAM-SHA-1$4096:c2FsdA==${key}:{key}"),
        format!("scram-sha-256$4096:c2FsdA==${key}:{key}"),
    ];
    for case in &cases {
        assert!(
            matches!(Verifier::parse(case), Err(ScramError::BadVerifier(_))),
            "{case:?} was accepted"
        );
    }
    assert!(Verifier::parse(&format!("SCRAM-SHA-256$4096:c2FsdA==${key}:{key}")).is_ok());
}

#[test]
fn bad_client_first_messages() {
    use ScramError::*;
    let cases: &[(&[u8], Option<ScramError>)] = &[
        (b"", None),
        (b"n", None),
        (b"n,", None),
        (b"n,,", None),
        (b"n,,n=", None),
        (b"n,,n=,", None),
        (b"n,,n=,r=", None),
        (b"n,,r=abc", None),
        (b"n,,n=,s=abc", None),
        (b"N,,n=,r=abc", None),
        (b"yy,,n=,r=abc", None),
        (b",,n=,r=abc", None),
        (b"n,x,n=,r=abc", None),
        (b"n,a=user,n=,r=abc", None),
        (b"n,,m=ext,n=,r=abc", None),
        (b"n,,n=bad=user,r=abc", None),
        (b"n,,n=bad=2,r=abc", None),
        (b"n,,n=nul\0,r=abc", None),
        (b"n,,n=,r=a\x01b", None),
        (b"n,,n=,r=a b", None),
        (b"n,,n=,r=abc\xc3\xa9", None),
        (b"n,,n=\xff,r=abc", None),
        (b"n,,n=,r=abc,", None),
        (b"n,,n=,r=abc,x", None),
        (b"n,,n=,r=abc,x=", None),
        (b"n,,n=,r=abc,1=x", None),
        (b"n,,n=,r=abc,m=x", None),
        (b"n,,r=abc,n=", None),
        (
            b"p=tls-server-end-point,,n=,r=abc",
            Some(ChannelBindingUnsupported),
        ),
        (b"p=,,n=,r=abc", Some(ChannelBindingUnsupported)),
    ];
    for (msg, expected) in cases {
        let mut server = ServerExchange::new(quick_verifier("pw"));
        let err = server.server_first(msg).unwrap_err();
        match expected {
            Some(e) => assert_eq!(&err, e, "{:?}", String::from_utf8_lossy(msg)),
            None => assert!(
                matches!(err, Malformed(_)),
                "{:?} -> {err:?}",
                String::from_utf8_lossy(msg)
            ),
        }
        // After an error the exchange cannot continue.
        assert!(matches!(
            server.server_final(b"c=biws,r=abc,p=x"),
            Err(InvalidState(_))
        ));
    }
    for ok in [
        &b"n,,n=,r=abc"[..],
        b"y,,n=,r=abc",
        b"n,,n=us=2Cer=3D,r=abc,x=ext",
        b"n,,n=j\xc3\xb6rg,r=!\"#$%&'()*+-./~",
    ] {
        let mut server = ServerExchange::new(quick_verifier("pw"));
        assert!(
            server.server_first(ok).is_ok(),
            "{:?}",
            String::from_utf8_lossy(ok)
        );
    }
}

#[test]
fn bad_client_final_messages() {
    use ScramError::*;
    let verifier = quick_verifier("pw");
    let fresh = |first: &str| {
        let mut s = ServerExchange::with_fixed_nonce(verifier.clone(), "SNONCE");
        s.server_first(first.as_bytes()).unwrap();
        s
    };
    // A correct proof for the "n,," exchange with nonce CNONCE/SNONCE.
    let good = {
        let mut client = ClientExchange::with_password("pw").fixed("", "CNONCE");
        client.client_first();
        let server_first = format!("r=CNONCESNONCE,s={},i=2", B64.encode(b"quick-salt"));
        to_str(client.client_final(server_first.as_bytes()).unwrap())
    };
    assert!(fresh("n,,n=,r=CNONCE")
        .server_final(good.as_bytes())
        .is_ok());
    let proof = good.rsplit_once(",p=").unwrap().1.to_owned();
    let zero = B64.encode([0u8; 32]);
    let cases: Vec<(String, Option<ScramError>)> = vec![
        (String::new(), None),
        ("c=biws".into(), None),
        ("c=biws,r=CNONCESNONCE".into(), None),
        ("c=biws,r=CNONCESNONCE,p=".into(), None),
        ("c=biws,r=CNONCESNONCE,p=AAAA".into(), None),
        (format!("c=biws,r=CNONCESNONCE,p={proof}="), None),
        (format!("c=biws,r=CNONCESNONCE,p={proof},x=y"), None),
        (format!("c=biws,r=CNONCESNONCE,,p={proof}"), None),
        (format!("p={proof}"), None),
        (format!("r=CNONCESNONCE,p={proof}"), None),
        (format!("r=CNONCESNONCE,c=biws,p={proof}"), None),
        (format!("c=bi!s,r=CNONCESNONCE,p={proof}"), None),
        (format!("c=biws,r=,p={proof}"), None),
        (format!("c=biws,r=CNONCE SNONCE,p={proof}"), None),
        (format!("c=biws,n=,r=CNONCESNONCE,p={proof}"), None),
        (format!("c=biws,r=CNONCESNONCE,m=x,p={proof}"), None),
        (format!("C=biws,r=CNONCESNONCE,p={proof}"), None),
        (
            format!("c=eSws,r=CNONCESNONCE,p={proof}"),
            Some(ChannelBindingMismatch),
        ),
        (
            format!("c=,r=CNONCESNONCE,p={proof}"),
            Some(ChannelBindingMismatch),
        ),
        (
            format!("c=cD10bHMtdW5pcXVlLCw=,r=CNONCESNONCE,p={proof}"),
            Some(ChannelBindingMismatch),
        ),
        (format!("c=biws,r=CNONCE,p={proof}"), Some(NonceMismatch)),
        (
            format!("c=biws,r=CNONCESNONCEX,p={proof}"),
            Some(NonceMismatch),
        ),
        (
            format!("c=biws,r=cNONCESNONCE,p={proof}"),
            Some(NonceMismatch),
        ),
        (format!("c=biws,r=CNONCESNONCE,p={zero}"), Some(AuthFailed)),
        // An extension changes the AuthMessage, so the old proof no longer fits.
        (
            format!("c=biws,r=CNONCESNONCE,x=1,p={proof}"),
            Some(AuthFailed),
        ),
    ];
    for (msg, expected) in cases {
        let err = fresh("n,,n=,r=CNONCE")
            .server_final(msg.as_bytes())
            .unwrap_err();
        match expected {
            Some(e) => assert_eq!(err, e, "{msg:?}"),
            None => assert!(matches!(err, Malformed(_)), "{msg:?} -> {err:?}"),
        }
    }
    // "y,," clients must echo "y,," (eSws).
    let mut s = fresh("y,,n=,r=CNONCE");
    assert_eq!(
        s.server_final(good.as_bytes()).unwrap_err(),
        ChannelBindingMismatch
    );
    let mut s = fresh("y,,n=,r=CNONCE");
    let y_final = format!("c=eSws,r=CNONCESNONCE,p={proof}");
    // Proof was for another AuthMessage, but the message itself is accepted up to the proof check.
    assert_eq!(s.server_final(y_final.as_bytes()).unwrap_err(), AuthFailed);
}

#[test]
fn y_flag_client_authenticates() {
    // A client that supports channel binding but was not offered PLUS ("y,,").
    let verifier = quick_verifier("pw");
    let mut server = ServerExchange::with_fixed_nonce(verifier.clone(), "SNONCE");
    let sf = to_str(server.server_first(b"y,,n=,r=CNONCE").unwrap());
    let without_proof = "c=eSws,r=CNONCESNONCE";
    let auth = format!("n=,r=CNONCE,{sf},{without_proof}");
    let key = crypto::Keys::from_password(b"pw", b"quick-salt", 2).client_key;
    let mut proof = *key.as_bytes();
    crypto::xor_into(
        &mut proof,
        &crypto::hmac(&key.stored_key(), auth.as_bytes()),
    );
    let cf = format!("{without_proof},p={}", B64.encode(proof));
    let (_, got) = server.server_final(cf.as_bytes()).unwrap();
    assert_eq!(got, key);
}

#[test]
fn bad_server_first_messages() {
    use ScramError::*;
    let salt = B64.encode(b"quick-salt");
    let cases: Vec<(String, Option<ScramError>)> = vec![
        (String::new(), None),
        ("r=CNONCEx".into(), None),
        ("r=CNONCEx,s=".into(), None),
        (format!("r=CNONCEx,s={salt}"), None),
        (format!("r=CNONCEx,s={salt},i="), None),
        (format!("r=CNONCEx,s={salt},i=0"), None),
        (format!("r=CNONCEx,s={salt},i=-1"), None),
        (format!("r=CNONCEx,s={salt},i=+2"), None),
        (format!("r=CNONCEx,s={salt},i=2x"), None),
        (format!("r=CNONCEx,s={salt},i=4294967296"), None),
        (format!("r=CNONCEx,s={salt},i=2,"), None),
        (format!("r=CNONCEx,s={salt},i=2,=x"), None),
        (format!("r=CNONCEx,i=2,s={salt}"), None),
        (format!("s={salt},r=CNONCEx,i=2"), None),
        (format!("m=x,r=CNONCEx,s={salt},i=2"), None),
        ("r=CNONCEx,s=,i=2".into(), None),
        ("r=CNONCEx,s=!!!!,i=2".into(), None),
        ("r=CNONCEx,s=c2FsdA,i=2".into(), None),
        (format!("r=,s={salt},i=2"), None),
        (format!("r=CNONCE\x7f,s={salt},i=2"), None),
        (format!("r=CNONCE,s={salt},i=2"), Some(NonceMismatch)),
        (format!("r=CNONC,s={salt},i=2"), Some(NonceMismatch)),
        (format!("r=XNONCEx,s={salt},i=2"), Some(NonceMismatch)),
    ];
    for (msg, expected) in cases {
        let mut client = ClientExchange::with_password("pw").fixed("", "CNONCE");
        client.client_first();
        let err = client.client_final(msg.as_bytes()).unwrap_err();
        match expected {
            Some(e) => assert_eq!(err, e, "{msg:?}"),
            None => assert!(matches!(err, Malformed(_)), "{msg:?} -> {err:?}"),
        }
        assert!(matches!(
            client.client_final(msg.as_bytes()),
            Err(InvalidState(_))
        ));
    }
    let mut client = ClientExchange::with_password("pw").fixed("", "CNONCE");
    client.client_first();
    assert!(client
        .client_final(format!("r=CNONCEx,s={salt},i=2,x=ext").as_bytes())
        .is_ok());
    let mut client = ClientExchange::with_password("pw");
    client.client_first();
    assert_eq!(
        client.client_final(b"\xff"),
        Err(Malformed("message is not UTF-8"))
    );
}

#[test]
fn bad_server_final_messages() {
    use ScramError::*;
    let verifier = quick_verifier("pw");
    let mut client = ClientExchange::with_password("pw");
    let mut server = ServerExchange::new(verifier);
    let sf = server.server_first(&client.client_first()).unwrap();
    let cf = client.client_final(&sf).unwrap();
    let (good, _) = server.server_final(&cf).unwrap();
    let good = to_str(good);
    let zero = B64.encode([0u8; 32]);
    let cases: Vec<(String, ScramError)> = vec![
        (String::new(), Malformed("")),
        ("v=".into(), Malformed("")),
        ("v=AAAA".into(), Malformed("")),
        ("x=abc".into(), Malformed("")),
        ("e=".into(), Malformed("")),
        ("V=abc".into(), Malformed("")),
        (format!("{good}="), Malformed("")),
        (format!("{good},"), Malformed("")),
        (format!(" {good}"), Malformed("")),
        (format!("v={zero}"), ServerSignatureMismatch),
        (
            "e=invalid-proof".into(),
            ServerError("invalid-proof".into()),
        ),
    ];
    for (msg, expected) in cases {
        let err = client.verify_server_final(msg.as_bytes()).unwrap_err();
        match expected {
            Malformed(_) => assert!(matches!(err, Malformed(_)), "{msg:?} -> {err:?}"),
            e => assert_eq!(err, e, "{msg:?}"),
        }
    }
    client.verify_server_final(good.as_bytes()).unwrap();
    client
        .verify_server_final(format!("{good},x=ext").as_bytes())
        .unwrap();
}

#[test]
fn steps_out_of_order() {
    let mut server = ServerExchange::new(quick_verifier("pw"));
    assert!(matches!(
        server.server_final(b"c=biws,r=a,p=b"),
        Err(ScramError::InvalidState(_))
    ));
    let mut server = ServerExchange::new(quick_verifier("pw"));
    server.server_first(b"n,,n=,r=abc").unwrap();
    assert!(matches!(
        server.server_first(b"n,,n=,r=abc"),
        Err(ScramError::InvalidState(_))
    ));
    let mut client = ClientExchange::with_password("pw");
    assert!(matches!(
        client.client_final(b"r=a,s=c2FsdA==,i=1"),
        Err(ScramError::InvalidState(_))
    ));
    assert!(matches!(
        client.verify_server_final(b"v=x"),
        Err(ScramError::InvalidState(_))
    ));
    assert_eq!(client.client_key(), None);
}

#[test]
fn nonces_are_random_and_printable() {
    let mut a = ClientExchange::with_password("pw");
    let mut b = ClientExchange::with_password("pw");
    let fa = to_str(a.client_first());
    let fb = to_str(b.client_first());
    assert_ne!(fa, fb);
    let nonce = fa.strip_prefix("n,,n=,r=").unwrap();
    assert_eq!(nonce.len(), 24);
    assert!(!nonce.contains(','));
}

#[test]
fn mock_exchange_always_fails_with_stable_salt() {
    let salt_of = |ex: &mut ServerExchange| {
        to_str(ex.server_first(b"n,,n=,r=abc").unwrap())
            .split(',')
            .nth(1)
            .unwrap()
            .to_owned()
    };
    let mut m1 = ServerExchange::mock("ghost", b"proxy secret");
    let mut m2 = ServerExchange::mock("ghost", b"proxy secret");
    let mut m3 = ServerExchange::mock("other", b"proxy secret");
    let s1 = salt_of(&mut m1);
    assert_eq!(s1, salt_of(&mut m2));
    assert_ne!(s1, salt_of(&mut m3));
    let zero = B64.encode([0u8; 32]);
    let nonce = {
        let mut m = ServerExchange::mock("ghost", b"proxy secret");
        let sf = to_str(m.server_first(b"n,,n=,r=abc").unwrap());
        let nonce = sf.split(',').next().unwrap().to_owned();
        let cf = format!("c=biws,{nonce},p={zero}");
        assert_eq!(
            m.server_final(cf.as_bytes()).unwrap_err(),
            ScramError::AuthFailed
        );
        nonce
    };
    assert!(nonce.starts_with("r=abc"));
}

#[test]
fn secrets_are_not_debug_printed() {
    let v = Verifier::from_password("secret", b"saltsaltsalt", 4096);
    let key = crypto::Keys::from_password(b"secret", b"saltsaltsalt", 4096).client_key;
    let dbg = format!("{key:?} {v:?}");
    for secret in [
        B64.encode(key.as_bytes()),
        B64.encode(v.stored_key()),
        B64.encode(v.server_key()),
        format!("{:?}", key.as_bytes()),
        format!("{}", key.as_bytes()[0]),
    ] {
        assert!(!dbg.contains(&secret), "{dbg} leaks {secret}");
    }
    let ex = ClientExchange::with_password("hunter2");
    assert!(!format!("{ex:?}").contains("hunter2"));
    let sx = ServerExchange::new(v);
    assert!(!format!("{sx:?}").contains("UdmKRUjf"));
}

/// Mutates valid messages at random and feeds them to every parser: errors
/// are fine, panics are not.
#[test]
fn fuzz_never_panics() {
    let mut rng = StdRng::seed_from_u64(0x5c7a_0001);
    let verifier = quick_verifier("pw");
    let seeds: [&[u8]; 6] = [
        b"n,,n=us=2Cer,r=CNONCE,x=1",
        b"c=biws,r=CNONCESNONCE,p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=",
        b"r=CNONCESNONCE,s=cXVpY2stc2FsdA==,i=2",
        b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=",
        b"SCRAM-SHA-256$4096:c2FsdA==$UdmKRUjfgm0U6mfMFFn/tGaEoriNY2YlrUES5w+4kaA=:ZH6upP+u0RFc4kNZYflxg+txwr3oIlzDM/JXePM5XCY=",
        b",,,===\xc3\xa9\xff\0",
    ];
    let alphabet = b",=nrcpsivemy0123456789+/ \x00\xff\xc3\xa9AZaz";
    for _ in 0..20_000 {
        let mut msg = seeds[rng.gen_range(0..seeds.len())].to_vec();
        for _ in 0..rng.gen_range(1..4) {
            let pos = rng.gen_range(0..=msg.len());
            match rng.gen_range(0..4) {
                0 if pos < msg.len() => {
                    msg.remove(pos);
                }
                1 => msg.insert(pos, alphabet[rng.gen_range(0..alphabet.len())]),
                2 if pos < msg.len() => msg[pos] = alphabet[rng.gen_range(0..alphabet.len())],
                _ => msg.truncate(pos),
            }
        }
        let mut server = ServerExchange::with_fixed_nonce(verifier.clone(), "SNONCE");
        let _ = server.server_first(&msg);
        let mut server = ServerExchange::with_fixed_nonce(verifier.clone(), "SNONCE");
        server.server_first(b"n,,n=,r=CNONCE").unwrap();
        let _ = server.server_final(&msg);
        let mut client = ClientExchange::with_client_key(
            ClientKey::from_bytes([1; 32]),
            Some(*verifier.server_key()),
        )
        .fixed("", "CNONCE");
        client.client_first();
        let _ = client.client_final(&msg);
        let mut client = ClientExchange::with_client_key(ClientKey::from_bytes([1; 32]), None)
            .fixed("", "CNONCE");
        client.client_first();
        client
            .client_final(b"r=CNONCESNONCE,s=c2FsdA==,i=1")
            .unwrap();
        let _ = client.verify_server_final(&msg);
        if let Ok(s) = std::str::from_utf8(&msg) {
            let _ = Verifier::parse(s);
        }
    }
}
