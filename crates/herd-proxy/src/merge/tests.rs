use super::*;

fn num(t: &str) -> Decimal {
    Decimal::parse(t).unwrap_or_else(|| panic!("{t}"))
}

/// numeric's binary form of base-10000 digits.
fn bin(weight: i16, negative: bool, digits: &[u16]) -> Vec<u8> {
    let mut b = Vec::new();
    b.extend_from_slice(&(digits.len() as u16).to_be_bytes());
    b.extend_from_slice(&weight.to_be_bytes());
    b.extend_from_slice(&(if negative { 0x4000u16 } else { 0 }).to_be_bytes());
    b.extend_from_slice(&0u16.to_be_bytes());
    for d in digits {
        b.extend_from_slice(&d.to_be_bytes());
    }
    b
}

#[test]
fn numerics_order_as_in_postgresql() {
    let sorted = [
        "-Infinity",
        "-100",
        "-99.5",
        "-0.001",
        "0",
        "0.0001",
        "0.5",
        "1",
        "1.05",
        "9.99",
        "10",
        "100.000001",
        "12345678901234567890",
        "Infinity",
        "NaN",
    ];
    for w in sorted.windows(2) {
        assert_eq!(num(w[0]).cmp(&num(w[1])), Ordering::Less, "{w:?}");
    }
    assert_eq!(num("1.50").cmp(&num("1.5")), Ordering::Equal);
    assert_eq!(num("-0.00").cmp(&num("0")), Ordering::Equal);
    assert_eq!(num("007").cmp(&num("7.000")), Ordering::Equal);
    assert!(Decimal::parse("1e5").is_none());
    // The binary form decodes to the same values.
    assert_eq!(Decimal::decode(&bin(0, false, &[12])), Some(num("12")));
    assert_eq!(
        Decimal::decode(&bin(1, true, &[1, 2345])),
        Some(num("-12345"))
    );
    assert_eq!(Decimal::decode(&bin(-1, false, &[5000])), Some(num("0.5")));
    assert_eq!(
        Decimal::decode(&bin(-2, false, &[7])),
        Some(num("0.00000007"))
    );
    assert_eq!(
        Decimal::decode(&bin(0, false, &[3, 1400])),
        Some(num("3.14"))
    );
    assert_eq!(
        Decimal::decode(&bin(2, false, &[1])),
        Some(num("100000000"))
    );
    assert_eq!(Decimal::decode(&bin(0, false, &[])), Some(num("0")));
}

fn v(type_oid: u32, text: &str) -> SortValue {
    sort_value(type_oid, 0, Some(text.as_bytes())).unwrap_or_else(|e| panic!("{e}"))
}

fn b(type_oid: u32, bytes: &[u8]) -> SortValue {
    sort_value(type_oid, 1, Some(bytes)).unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn text_and_binary_forms_agree() {
    assert_eq!(v(oid::INT4, "-7"), b(oid::INT4, &(-7i32).to_be_bytes()));
    assert_eq!(
        v(oid::INT8, "9000000000"),
        b(oid::INT8, &9_000_000_000i64.to_be_bytes())
    );
    assert_eq!(v(oid::BOOL, "t"), b(oid::BOOL, &[1]));
    assert_eq!(v(oid::DATE, "2000-01-02"), SortValue::Int(1));
    assert_eq!(v(oid::DATE, "1999-12-31"), SortValue::Int(-1));
    assert_eq!(
        v(oid::DATE, "2024-03-01"),
        b(oid::DATE, &8826i32.to_be_bytes())
    );
    assert_eq!(
        v(oid::TIMESTAMP, "2000-01-01 00:00:01.5"),
        SortValue::Int(1_500_000)
    );
    // The same instant in two zones.
    assert_eq!(
        v(oid::TIMESTAMPTZ, "2000-01-01 02:00:00+02"),
        v(oid::TIMESTAMPTZ, "2000-01-01 00:00:00+00")
    );
    assert_eq!(
        v(oid::TIMESTAMPTZ, "1999-12-31 19:30:00-04:30"),
        SortValue::Int(0)
    );
    assert_eq!(
        v(oid::UUID, "00000000-0000-0000-0000-0000000000ff"),
        b(
            oid::UUID,
            &[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff]
        )
    );
    assert_eq!(v(oid::BPCHAR, "ab  "), v(oid::TEXT, "ab"));
    assert!(
        sort_value(600, 0, Some(b"(1,2)")).is_err(),
        "point has no merge order"
    );
    assert!(
        sort_value(oid::DATE, 0, Some(b"03/01/2024")).is_err(),
        "only ISO dates"
    );
}

#[test]
fn keys_order_with_direction_and_nulls() {
    let asc = KeyOrder {
        descending: false,
        nulls_first: false,
    };
    let desc = KeyOrder {
        descending: true,
        nulls_first: true,
    };
    let (one, two, null) = (SortValue::Int(1), SortValue::Int(2), SortValue::Null);
    assert_eq!(
        compare_keys(
            &[asc],
            std::slice::from_ref(&one),
            std::slice::from_ref(&two)
        ),
        Ordering::Less
    );
    assert_eq!(
        compare_keys(
            &[asc],
            std::slice::from_ref(&null),
            std::slice::from_ref(&two)
        ),
        Ordering::Greater
    );
    assert_eq!(
        compare_keys(
            &[desc],
            std::slice::from_ref(&one),
            std::slice::from_ref(&two)
        ),
        Ordering::Greater
    );
    assert_eq!(
        compare_keys(
            &[desc],
            std::slice::from_ref(&null),
            std::slice::from_ref(&two)
        ),
        Ordering::Less
    );
    // The second key breaks ties of the first.
    assert_eq!(
        compare_keys(
            &[asc, desc],
            &[one.clone(), one.clone()],
            &[one.clone(), two.clone()]
        ),
        Ordering::Greater
    );
    let (nan, inf) = (SortValue::Float(f64::NAN), SortValue::Float(f64::INFINITY));
    assert_eq!(compare(&nan, &inf), Ordering::Greater);
    assert_eq!(
        compare(&SortValue::Float(-0.0), &SortValue::Float(0.0)),
        Ordering::Equal
    );
}
