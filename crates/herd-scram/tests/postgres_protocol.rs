//! Interoperability with `postgres-protocol`, the SCRAM implementation used by
//! tokio-postgres: its verifiers parse, its client logs in to our server, and
//! the ClientKey recovered from its login works for pass-through.
#![allow(clippy::unwrap_used, missing_docs)]

use herd_scram::{ClientExchange, ScramError, ServerExchange, Verifier};
use postgres_protocol::authentication::sasl::{ChannelBinding, ScramSha256};
use postgres_protocol::password::scram_sha_256;

/// Runs their client against our server; returns the recovered key.
fn their_client_our_server(
    password: &[u8],
    binding: ChannelBinding,
    verifier: &Verifier,
) -> Result<herd_scram::ClientKey, ScramError> {
    let mut client = ScramSha256::new(password, binding);
    let mut server = ServerExchange::new(verifier.clone());
    let server_first = server.server_first(client.message())?;
    client.update(&server_first).unwrap();
    let (server_final, key) = server.server_final(client.message())?;
    client.finish(&server_final).unwrap();
    Ok(key)
}

#[test]
fn parses_their_verifiers() {
    for password in ["secret", "pässwörd", "with spaces and $:,= symbols"] {
        let text = scram_sha_256(password.as_bytes());
        let verifier = Verifier::parse(&text).unwrap();
        assert_eq!(verifier.to_string(), text);
        assert_eq!(verifier.iterations(), 4096);

        // Our password client authenticates against it, and the recovered
        // ClientKey belongs to the verifier.
        let mut client = ClientExchange::with_password(password);
        let mut server = ServerExchange::new(verifier.clone());
        let server_first = server.server_first(&client.client_first()).unwrap();
        let client_final = client.client_final(&server_first).unwrap();
        let (server_final, key) = server.server_final(&client_final).unwrap();
        client.verify_server_final(&server_final).unwrap();
        assert!(key.matches(&verifier));
        assert_eq!(client.client_key(), Some(&key));
        assert_eq!(client.server_key(), Some(verifier.server_key()));
    }
}

#[test]
fn their_client_logs_in_to_our_server() {
    let verifier = Verifier::parse(&scram_sha_256(b"secret")).unwrap();
    let key = their_client_our_server(b"secret", ChannelBinding::unsupported(), &verifier).unwrap();
    assert!(key.matches(&verifier));
    // "y,,": client supports channel binding, server did not offer it.
    let key2 =
        their_client_our_server(b"secret", ChannelBinding::unrequested(), &verifier).unwrap();
    assert_eq!(key, key2);
}

#[test]
fn their_client_with_wrong_password_or_channel_binding_fails() {
    let verifier = Verifier::parse(&scram_sha_256(b"secret")).unwrap();
    assert_eq!(
        their_client_our_server(b"Secret", ChannelBinding::unsupported(), &verifier).unwrap_err(),
        ScramError::AuthFailed
    );
    assert_eq!(
        their_client_our_server(
            b"secret",
            ChannelBinding::tls_server_end_point(vec![1, 2, 3]),
            &verifier
        )
        .unwrap_err(),
        ScramError::ChannelBindingUnsupported
    );
}

#[test]
fn key_recovered_from_their_login_passes_through() {
    let verifier = Verifier::parse(&scram_sha_256(b"pass-through")).unwrap();
    let key =
        their_client_our_server(b"pass-through", ChannelBinding::unsupported(), &verifier).unwrap();
    let mut client = ClientExchange::with_verifier(key, &verifier);
    let mut server = ServerExchange::new(verifier.clone());
    let server_first = server.server_first(&client.client_first()).unwrap();
    let client_final = client.client_final(&server_first).unwrap();
    let (server_final, again) = server.server_final(&client_final).unwrap();
    client.verify_server_final(&server_final).unwrap();
    assert!(again.matches(&verifier));
}
