//! Malformed input: nothing panics on arbitrary bytes, and specific bad inputs give the
//! documented errors.
#![allow(clippy::unwrap_used)]

use herd_wire::backend::{
    Authentication, BackendKeyData, CommandComplete, DataRow, ErrorFields, ParameterStatus,
    ReadyForQuery,
};
use herd_wire::frontend::{
    password_message, Bind, Close, Describe, Execute, Parse, Query, SaslInitialResponse,
};
use herd_wire::{encode, parse_startup, split_frame, split_startup, StartupRequest, WireError};
use proptest::prelude::*;

/// Runs every body decoder; when one succeeds, checks that re-encoding its result
/// reproduces the body byte for byte (the decoders accept only canonical encodings).
fn decode_all(body: &[u8]) {
    fn check(tag: u8, body: &[u8], encoded: &[u8]) {
        assert_eq!(encoded.first(), Some(&tag));
        assert_eq!(&encoded[5..], body, "tag {}", tag as char);
    }
    let mut b = Vec::new();
    if let Ok(q) = Query::decode(body) {
        encode::query(&mut b, q.sql).unwrap();
        check(b'Q', body, &b);
    }
    b.clear();
    if let Ok(p) = Parse::decode(body) {
        encode::parse(&mut b, p.name, p.query, &p.param_types).unwrap();
        check(b'P', body, &b);
    }
    b.clear();
    if let Ok(x) = Bind::decode(body) {
        encode::bind_renamed(&mut b, x.portal, x.statement, x.rest).unwrap();
        check(b'B', body, &b);
    }
    b.clear();
    if let Ok(d) = Describe::decode(body) {
        encode::describe(&mut b, d.kind, d.name).unwrap();
        check(b'D', body, &b);
    }
    b.clear();
    if let Ok(c) = Close::decode(body) {
        encode::close(&mut b, c.kind, c.name).unwrap();
        check(b'C', body, &b);
    }
    b.clear();
    if let Ok(e) = Execute::decode(body) {
        encode::execute(&mut b, e.portal, e.max_rows).unwrap();
        check(b'E', body, &b);
    }
    b.clear();
    if let Ok(s) = SaslInitialResponse::decode(body) {
        encode::sasl_initial_response(&mut b, s.mechanism, s.data).unwrap();
        check(b'p', body, &b);
    }
    b.clear();
    if let Ok(p) = password_message(body) {
        encode::password_message(&mut b, p).unwrap();
        check(b'p', body, &b);
    }
    b.clear();
    if let Ok(r) = ReadyForQuery::decode(body) {
        encode::ready_for_query(&mut b, r.status).unwrap();
        check(b'Z', body, &b);
    }
    b.clear();
    if let Ok(p) = ParameterStatus::decode(body) {
        encode::parameter_status(&mut b, p.name, p.value).unwrap();
        check(b'S', body, &b);
    }
    b.clear();
    if let Ok(k) = BackendKeyData::decode(body) {
        encode::backend_key_data(&mut b, k.pid, k.key);
        check(b'K', body, &b);
    }
    b.clear();
    if let Ok(c) = CommandComplete::decode(body) {
        encode::command_complete(&mut b, c.tag).unwrap();
        check(b'C', body, &b);
    }
    b.clear();
    if let Ok(d) = DataRow::decode(body) {
        encode::data_row(&mut b, &d.columns).unwrap();
        check(b'D', body, &b);
    }
    if let Ok(f) = ErrorFields::decode(body) {
        let _ = (f.severity(), f.code(), f.message(), f.iter().count());
    }
    let _ = Authentication::decode(body);
}

/// Bytes rich in nuls and ASCII so that decoders get past their first field.
fn body() -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(
        prop_oneof![Just(0u8), b'a'..=b'z', Just(0xff), any::<u8>()],
        0..48,
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2048))]

    #[test]
    fn random_bytes_never_panic(data in prop::collection::vec(any::<u8>(), 0..128),
                                max in 0usize..256) {
        let _ = split_startup(&data, max);
        let _ = parse_startup(&data);
        let mut rest = data.as_slice();
        while let Ok(Some((f, used))) = split_frame(rest, max) {
            decode_all(f.body);
            rest = &rest[used..];
        }
        decode_all(&data);
    }

    #[test]
    fn random_bodies_never_panic_and_reencode_exactly(b in body()) {
        decode_all(&b);
    }

    #[test]
    fn random_startup_payloads(code in prop_oneof![Just(80_877_102i32), Just(196_608), any::<i32>()],
                               payload in body()) {
        let mut p = i32::try_from(payload.len() + 8).unwrap().to_be_bytes().to_vec();
        p.extend_from_slice(&code.to_be_bytes());
        p.extend_from_slice(&payload);
        let (packet, used) = split_startup(&p, 10_000).unwrap().unwrap();
        prop_assert_eq!(used, p.len());
        if let Ok(StartupRequest::Startup { major: 3, minor: 0, params }) = parse_startup(packet) {
            let mut b = Vec::new();
            encode::startup_message(&mut b, &params).unwrap();
            prop_assert_eq!(b, p);
        }
    }
}

#[test]
fn length_below_four() {
    for len in [i32::MIN, -1, 0, 1, 2, 3] {
        let mut b = vec![b'Q'];
        b.extend_from_slice(&len.to_be_bytes());
        assert_eq!(split_frame(&b, 100), Err(WireError::BadLength(len)));
    }
    assert_eq!(
        split_startup(&[0, 0, 0, 4, 0, 0, 0, 0], 100),
        Err(WireError::BadLength(4))
    );
}

#[test]
fn length_above_max() {
    assert_eq!(
        split_frame(&[b'D', 0, 0, 0x10, 0x01], 4096),
        Err(WireError::TooLong {
            len: 4097,
            max: 4096
        })
    );
    assert_eq!(split_frame(&[b'D', 0, 0, 0x10, 0x00], 4096), Ok(None));
    assert_eq!(
        split_startup(&[0, 1, 0, 0], 10_000),
        Err(WireError::TooLong {
            len: 65_536,
            max: 10_000
        })
    );
}

#[test]
fn string_without_nul() {
    assert_eq!(Query::decode(b"SELECT"), Err(WireError::MissingNul));
    assert_eq!(Execute::decode(b"portal"), Err(WireError::MissingNul));
    assert_eq!(
        CommandComplete::decode(b"SELECT 1"),
        Err(WireError::MissingNul)
    );
    assert_eq!(
        parse_startup(b"\0\0\0\x0c\0\x03\0\0user"),
        Err(WireError::MissingNul)
    );
}

#[test]
fn invalid_utf8() {
    // SQL text and names are in the client's encoding: kept as bytes, never rejected.
    assert_eq!(
        Query::decode(b"\xc0\xaf\0").map(|q| q.sql),
        Ok(&b"\xc0\xaf"[..])
    );
    assert_eq!(
        Parse::decode(b"\xff\0q\0\0\0").map(|p| p.name),
        Ok(&b"\xff"[..])
    );
    assert_eq!(
        ParameterStatus::decode(b"a\0\xed\xa0\x80\0"),
        Err(WireError::InvalidUtf8)
    );
    assert_eq!(
        ErrorFields::decode(b"M\xfe\0\0"),
        Err(WireError::InvalidUtf8)
    );
}

#[test]
fn truncated_bind() {
    let mut full = Vec::new();
    encode::bind_renamed(&mut full, "portal", "stmt", &[0, 0, 0, 0, 0, 0]).unwrap();
    let body = &full[5..];
    // Every cut inside the two names fails; cuts after them succeed with a shorter rest.
    for k in 0..body.len() {
        let r = Bind::decode(&body[..k]);
        if k < "portal\0stmt\0".len() {
            assert_eq!(r, Err(WireError::MissingNul), "cut at {k}");
        } else {
            assert!(r.is_ok());
        }
    }
    // A frame whose length claims more than has arrived is simply incomplete.
    assert_eq!(split_frame(&full[..full.len() - 1], 1024), Ok(None));
}
