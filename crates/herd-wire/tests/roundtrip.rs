//! Property tests: every encoder's output splits into exactly one frame that decodes
//! back to the encoded values.
#![allow(clippy::unwrap_used)]

use herd_wire::backend::{
    Authentication, BackendKeyData, CommandComplete, DataRow, ErrorFields, ParameterStatus,
    ReadyForQuery,
};
use herd_wire::frontend::{
    password_message, sasl_response, Bind, Close, Describe, Execute, Parse, Query,
    SaslInitialResponse,
};
use herd_wire::startup::MAX_STARTUP_LEN;
use herd_wire::{encode, parse_startup, split_frame, split_startup, Frame, StartupRequest};
use proptest::prelude::*;

const MAX: usize = 1 << 20;

/// Asserts `buf` is exactly one frame with `tag` and returns it.
fn only_frame(buf: &[u8], tag: u8) -> Frame<'_> {
    let (frame, used) = split_frame(buf, MAX).unwrap().unwrap();
    assert_eq!(used, buf.len());
    assert_eq!(frame.raw, buf);
    assert_eq!(frame.tag, tag);
    frame
}

fn text() -> impl Strategy<Value = String> {
    "[^\\x00]{0,24}"
}

fn name() -> impl Strategy<Value = String> {
    "[^\\x00]{1,24}"
}

fn bytes() -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(any::<u8>(), 0..64)
}

fn kind() -> impl Strategy<Value = u8> {
    prop_oneof![Just(b'S'), Just(b'P')]
}

proptest! {
    #[test]
    fn query(sql in text()) {
        let mut b = Vec::new();
        encode::query(&mut b, &sql).unwrap();
        let f = only_frame(&b, b'Q');
        prop_assert_eq!(Query::decode(f.body).unwrap().sql, sql.as_bytes());
    }

    #[test]
    fn parse(n in text(), q in text(), types in prop::collection::vec(any::<u32>(), 0..20)) {
        let mut b = Vec::new();
        encode::parse(&mut b, &n, &q, &types).unwrap();
        let p = Parse::decode(only_frame(&b, b'P').body).unwrap();
        prop_assert_eq!(p, Parse { name: n.as_bytes(), query: q.as_bytes(), param_types: types });
    }

    #[test]
    fn bind_rename(portal in text(), s1 in text(), s2 in text(), rest in bytes()) {
        let mut b = Vec::new();
        encode::bind_renamed(&mut b, &portal, &s1, &rest).unwrap();
        let bind = Bind::decode(only_frame(&b, b'B').body).unwrap();
        prop_assert_eq!(bind, Bind { portal: portal.as_bytes(), statement: s1.as_bytes(), rest: &rest });
        let mut renamed = Vec::new();
        encode::bind_renamed(&mut renamed, bind.portal, &s2, bind.rest).unwrap();
        let again = Bind::decode(only_frame(&renamed, b'B').body).unwrap();
        prop_assert_eq!(again, Bind { portal: portal.as_bytes(), statement: s2.as_bytes(), rest: &rest });
    }

    #[test]
    fn describe_close(k in kind(), n in text()) {
        let mut b = Vec::new();
        encode::describe(&mut b, k, &n).unwrap();
        prop_assert_eq!(
            Describe::decode(only_frame(&b, b'D').body).unwrap(),
            Describe { kind: k, name: n.as_bytes() }
        );
        let mut c = Vec::new();
        encode::close(&mut c, k, &n).unwrap();
        prop_assert_eq!(
            Close::decode(only_frame(&c, b'C').body).unwrap(),
            Close { kind: k, name: n.as_bytes() }
        );
    }

    #[test]
    fn execute(portal in text(), max_rows in any::<i32>()) {
        let mut b = Vec::new();
        encode::execute(&mut b, &portal, max_rows).unwrap();
        prop_assert_eq!(
            Execute::decode(only_frame(&b, b'E').body).unwrap(),
            Execute { portal: portal.as_bytes(), max_rows }
        );
    }

    #[test]
    fn sasl_client(mech in text(), data in prop::option::of(bytes()), resp in bytes()) {
        let mut b = Vec::new();
        encode::sasl_initial_response(&mut b, &mech, data.as_deref()).unwrap();
        prop_assert_eq!(
            SaslInitialResponse::decode(only_frame(&b, b'p').body).unwrap(),
            SaslInitialResponse { mechanism: &mech, data: data.as_deref() }
        );
        let mut r = Vec::new();
        encode::sasl_response(&mut r, &resp).unwrap();
        prop_assert_eq!(sasl_response(only_frame(&r, b'p').body), resp.as_slice());
    }

    #[test]
    fn password(pw in prop::collection::vec(1u8..=255, 0..32)) {
        let mut b = Vec::new();
        encode::password_message(&mut b, &pw).unwrap();
        prop_assert_eq!(password_message(only_frame(&b, b'p').body).unwrap(), pw.as_slice());
    }

    #[test]
    fn startup(params in prop::collection::vec((name(), text()), 0..8)) {
        let pairs: Vec<(&str, &str)> = params.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let mut b = Vec::new();
        encode::startup_message(&mut b, &pairs).unwrap();
        let (packet, used) = split_startup(&b, MAX_STARTUP_LEN).unwrap().unwrap();
        prop_assert_eq!(used, b.len());
        prop_assert_eq!(
            parse_startup(packet).unwrap(),
            StartupRequest::Startup { major: 3, minor: 0, params: pairs }
        );
    }

    #[test]
    fn cancel(pid in any::<i32>(), key in any::<i32>()) {
        let mut b = Vec::new();
        encode::cancel_request(&mut b, pid, key);
        let (packet, used) = split_startup(&b, MAX_STARTUP_LEN).unwrap().unwrap();
        prop_assert_eq!(used, 16);
        prop_assert_eq!(parse_startup(packet).unwrap(), StartupRequest::Cancel { pid, key });
    }

    #[test]
    fn authentication(
        mechs in prop::collection::vec(name(), 0..4),
        data in bytes(),
        salt in any::<[u8; 4]>(),
    ) {
        let m: Vec<&str> = mechs.iter().map(String::as_str).collect();
        let mut b = Vec::new();
        encode::authentication_sasl(&mut b, &m).unwrap();
        prop_assert_eq!(
            Authentication::decode(only_frame(&b, b'R').body).unwrap(),
            Authentication::Sasl { mechanisms: m.clone() }
        );
        b.clear();
        encode::authentication_sasl_continue(&mut b, &data).unwrap();
        prop_assert_eq!(
            Authentication::decode(only_frame(&b, b'R').body).unwrap(),
            Authentication::SaslContinue { data: &data }
        );
        b.clear();
        encode::authentication_sasl_final(&mut b, &data).unwrap();
        prop_assert_eq!(
            Authentication::decode(only_frame(&b, b'R').body).unwrap(),
            Authentication::SaslFinal { data: &data }
        );
        b.clear();
        encode::authentication_md5_password(&mut b, salt);
        prop_assert_eq!(
            Authentication::decode(only_frame(&b, b'R').body).unwrap(),
            Authentication::Md5Password { salt }
        );
    }

    #[test]
    fn server_status(n in text(), v in text(), pid in any::<i32>(), key in any::<i32>(),
                     status in prop_oneof![Just(b'I'), Just(b'T'), Just(b'E')], tag in text()) {
        let mut b = Vec::new();
        encode::parameter_status(&mut b, &n, &v).unwrap();
        prop_assert_eq!(
            ParameterStatus::decode(only_frame(&b, b'S').body).unwrap(),
            ParameterStatus { name: &n, value: &v }
        );
        b.clear();
        encode::backend_key_data(&mut b, pid, key);
        prop_assert_eq!(
            BackendKeyData::decode(only_frame(&b, b'K').body).unwrap(),
            BackendKeyData { pid, key }
        );
        b.clear();
        encode::ready_for_query(&mut b, status).unwrap();
        prop_assert_eq!(ReadyForQuery::decode(only_frame(&b, b'Z').body).unwrap().status, status);
        b.clear();
        encode::command_complete(&mut b, &tag).unwrap();
        prop_assert_eq!(CommandComplete::decode(only_frame(&b, b'C').body).unwrap().tag, tag.as_str());
    }

    #[test]
    fn error_and_notice(sev in text(), code in text(), msg in text(), notice in any::<bool>()) {
        let mut b = Vec::new();
        let tag = if notice {
            encode::notice_response(&mut b, &sev, &code, &msg).unwrap();
            b'N'
        } else {
            encode::error_response(&mut b, &sev, &code, &msg).unwrap();
            b'E'
        };
        let f = ErrorFields::decode(only_frame(&b, tag).body).unwrap();
        prop_assert_eq!(f.severity(), Some(sev.as_str()));
        prop_assert_eq!(f.severity_nonlocalized(), Some(sev.as_str()));
        prop_assert_eq!(f.code(), Some(code.as_str()));
        prop_assert_eq!(f.message(), Some(msg.as_str()));
        prop_assert_eq!(f.iter().count(), 4);
    }

    #[test]
    fn data_row(cols in prop::collection::vec(prop::option::of(bytes()), 0..16)) {
        let c: Vec<Option<&[u8]>> = cols.iter().map(|o| o.as_deref()).collect();
        let mut b = Vec::new();
        encode::data_row(&mut b, &c).unwrap();
        prop_assert_eq!(DataRow::decode(only_frame(&b, b'D').body).unwrap().columns, c);
    }

    #[test]
    fn interior_nul_is_rejected_without_writing(prefix in text(), suffix in text()) {
        let bad = format!("{prefix}\0{suffix}");
        let mut b = b"untouched".to_vec();
        prop_assert!(encode::query(&mut b, &bad).is_err());
        prop_assert!(encode::parse(&mut b, "s", &bad, &[]).is_err());
        prop_assert!(encode::parameter_status(&mut b, &bad, "v").is_err());
        prop_assert!(encode::error_response(&mut b, "ERROR", "XX000", &bad).is_err());
        prop_assert!(encode::startup_message(&mut b, &[("user", &bad)]).is_err());
        prop_assert_eq!(b, b"untouched".to_vec());
    }
}

#[test]
fn fixed_messages() {
    let mut b = Vec::new();
    encode::ssl_request(&mut b);
    let (p, _) = split_startup(&b, 8).unwrap().unwrap();
    assert_eq!(parse_startup(p).unwrap(), StartupRequest::Ssl);
    b.clear();
    encode::gssenc_request(&mut b);
    assert_eq!(parse_startup(&b).unwrap(), StartupRequest::GssEnc);
    b.clear();
    encode::authentication_ok(&mut b);
    assert_eq!(
        Authentication::decode(only_frame(&b, b'R').body).unwrap(),
        Authentication::Ok
    );
    b.clear();
    encode::authentication_cleartext_password(&mut b);
    assert_eq!(
        Authentication::decode(only_frame(&b, b'R').body).unwrap(),
        Authentication::CleartextPassword
    );
    for (f, tag) in [
        (encode::sync as fn(&mut Vec<u8>), b'S'),
        (encode::flush, b'H'),
        (encode::terminate, b'X'),
        (encode::parse_complete, b'1'),
        (encode::bind_complete, b'2'),
        (encode::close_complete, b'3'),
        (encode::no_data, b'n'),
    ] {
        let mut b = Vec::new();
        f(&mut b);
        assert!(only_frame(&b, tag).body.is_empty());
    }
}
