//! Bad input must give an `Error`, quickly, never a panic or a huge allocation.
mod common;

use std::io::Read;
use std::time::{Duration, Instant};

use common::{bytes_of, small_writer};
use gguf::{read_header, read_header_sized, Error, GgmlType, Header, Writer};

fn both(bytes: &[u8]) -> (Result<Header, Error>, Result<Header, Error>) {
    (
        read_header(bytes),
        read_header_sized(bytes, bytes.len() as u64),
    )
}

#[test]
fn truncation_at_every_offset_is_an_error() {
    for version in [2, 3] {
        let bytes = bytes_of(&small_writer(version));
        let full = read_header(&bytes[..]).unwrap();
        let data_end = full.data_end() as usize;
        let mut first_ok = None;
        for len in 0..bytes.len() {
            let cut = &bytes[..len];
            let sized = read_header_sized(cut, len as u64);
            assert_eq!(
                sized.is_ok(),
                len >= data_end,
                "sized, len {len}: {sized:?}"
            );
            match (read_header(cut), first_ok) {
                (Ok(h), None) => {
                    assert_eq!(h, full);
                    first_ok = Some(len);
                }
                (Ok(_), Some(_)) => {}
                (Err(e), None) => {
                    if let Error::Truncated { offset, .. } = e {
                        assert!(offset <= len as u64, "offset {offset} past the cut {len}");
                    }
                }
                (Err(e), Some(ok)) => panic!("len {len} failed after {ok} worked: {e}"),
            }
        }
        // The stream reader needs exactly the bytes up to the end of the tensor infos.
        let ok = first_ok.unwrap();
        assert!(ok as u64 > full.data_offset - full.alignment && ok as u64 <= full.data_offset);
    }
}

#[test]
fn truncation_errors_name_what_and_where() {
    let bytes = bytes_of(&small_writer(3));
    let e = read_header(&bytes[..30]).unwrap_err();
    assert_eq!(
        e.to_string(),
        "file ends inside key of key/value pair 0 starting at byte 24"
    );
    let e = read_header(&bytes[..10]).unwrap_err();
    assert!(
        e.to_string().contains("tensor count starting at byte 8"),
        "{e}"
    );
}

#[test]
fn every_single_byte_corruption_is_handled() {
    let bytes = bytes_of(&small_writer(3));
    let start = Instant::now();
    for i in 0..bytes.len() {
        for v in [
            0x00,
            0xff,
            0x80,
            0x7f,
            bytes[i] ^ 0x01,
            bytes[i].wrapping_add(1),
        ] {
            let mut b = bytes.clone();
            b[i] = v;
            let _ = both(&b);
        }
    }
    assert!(start.elapsed() < Duration::from_secs(30));
}

/// "GGUF", version 3, then the given counts.
fn prefix(n_tensors: u64, n_kv: u64) -> Vec<u8> {
    let mut b = b"GGUF".to_vec();
    b.extend(3u32.to_le_bytes());
    b.extend(n_tensors.to_le_bytes());
    b.extend(n_kv.to_le_bytes());
    b
}

fn key(b: &mut Vec<u8>, k: &str, ty: u32) {
    b.extend((k.len() as u64).to_le_bytes());
    b.extend(k.as_bytes());
    b.extend(ty.to_le_bytes());
}

fn assert_fast_err(bytes: &[u8], needle: &str) {
    let start = Instant::now();
    let (a, b) = both(bytes);
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "too slow for {needle}"
    );
    let e = a.expect_err(needle);
    assert!(
        e.to_string().contains(needle),
        "expected '{needle}' in: {e}"
    );
    // Knowing the size may catch it earlier, with another message.
    let e = b.expect_err(needle).to_string();
    assert!(
        e.contains(needle) || e.contains("cannot fit") || e.contains("ends inside"),
        "{e}"
    );
}

#[test]
fn lying_counts_fail_fast() {
    assert_fast_err(&prefix(0, u64::MAX), "is negative");
    assert_fast_err(&prefix(1 << 62, 0), "");
    assert_fast_err(&prefix(0, 1 << 40), "");
    let e = read_header_sized(&prefix(1 << 40, 0)[..], 1 << 20).unwrap_err();
    assert!(e.to_string().contains("cannot fit in the"), "{e}");

    let mut b = prefix(0, 1);
    b.extend((1u64 << 62).to_le_bytes());
    assert_fast_err(&b, "key length 4611686018427387904 exceeds");

    let mut b = prefix(0, 1);
    b.extend((1u64 << 30).to_le_bytes()); // within the cap, but the data is not there
    assert_fast_err(&b, "key");

    let mut b = prefix(0, 1);
    key(&mut b, "k", 9);
    b.extend(10u32.to_le_bytes());
    b.extend((1u64 << 30).to_le_bytes());
    assert_fast_err(&b, "array");
    let e = read_header_sized(&b[..], b.len() as u64).unwrap_err();
    assert!(e.to_string().contains("cannot fit"), "{e}");

    let mut b = prefix(0, 1);
    key(&mut b, "k", 9);
    b.extend(0u32.to_le_bytes());
    b.extend((1u64 << 31).to_le_bytes());
    assert_fast_err(&b, "array length 2147483648 exceeds");

    let mut b = prefix(0, 1);
    key(&mut b, "k", 9);
    b.extend(8u32.to_le_bytes());
    b.extend((1u64 << 29).to_le_bytes());
    b.extend([0u8; 64]);
    assert_fast_err(&b, "k");
}

#[test]
fn infinite_streams_end_in_errors() {
    for fill in [0u8, 1, 0x80, 0xff] {
        let r = std::io::Cursor::new(prefix(0, 3)).chain(std::io::repeat(fill));
        assert!(read_header(r).is_err(), "fill {fill}");
    }
}

#[test]
fn deep_nesting_is_bounded() {
    let mut b = prefix(0, 1);
    key(&mut b, "deep", 9);
    for _ in 0..100_000 {
        b.extend(9u32.to_le_bytes());
        b.extend(1u64.to_le_bytes());
    }
    assert_fast_err(&b, "nested deeper than 8");
}

#[test]
fn structural_errors() {
    let mut b = prefix(0, 1);
    key(&mut b, "k", 13);
    assert_fast_err(&b, "value type 13 is not a GGUF value type");

    let mut b = prefix(0, 2);
    key(&mut b, "k", 0);
    b.push(1);
    key(&mut b, "k", 0);
    b.push(1);
    assert_fast_err(&b, "duplicate key 'k'");

    let mut b = prefix(0, 1);
    key(&mut b, "", 0);
    b.push(1);
    assert_fast_err(&b, "empty key");

    let tensor = |name: &str, dims: &[u64], ty: u32, offset: u64| {
        let mut t = (name.len() as u64).to_le_bytes().to_vec();
        t.extend(name.as_bytes());
        t.extend((dims.len() as u32).to_le_bytes());
        for d in dims {
            t.extend(d.to_le_bytes());
        }
        t.extend(ty.to_le_bytes());
        t.extend(offset.to_le_bytes());
        t
    };
    let with = |ts: &[Vec<u8>]| {
        let mut b = prefix(ts.len() as u64, 0);
        ts.iter().for_each(|t| b.extend(t));
        b.extend([0u8; 256]);
        b
    };
    assert_fast_err(
        &with(&[tensor("t", &[1, 1, 1, 1, 1], 0, 0)]),
        "5 dimensions",
    );
    assert_fast_err(&with(&[tensor("t", &[u64::MAX], 0, 0)]), "negative");
    assert_fast_err(
        &with(&[tensor("t", &[1 << 40, 1 << 40], 0, 0)]),
        "overflows int64",
    );
    assert_fast_err(
        &with(&[tensor("t", &[1 << 62], 0, 0)]),
        "not whole f32 blocks",
    );
    assert_fast_err(
        &with(&[tensor("t", &[4], 0, 3)]),
        "not a multiple of the alignment",
    );
    assert_fast_err(
        &with(&[tensor("t", &[4], 0, 0), tensor("t", &[4], 0, 32)]),
        "duplicate tensor name 't'",
    );
    assert_fast_err(&with(&[tensor("t", &[4], 0, u64::MAX - 31)]), "");
    assert!(read_header(&with(&[tensor("t", &[4], 0, 0)])[..]).is_ok());
}

#[test]
fn invalid_utf8_strings_are_kept_lossily() {
    let mut b = prefix(0, 1);
    key(&mut b, "k", 8);
    b.extend(2u64.to_le_bytes());
    b.extend([0xff, b'a']);
    let h = read_header(&b[..]).unwrap();
    assert_eq!(h.get_str("k"), Some("\u{fffd}a"));
}

#[test]
fn huge_declared_tensors_do_not_allocate() {
    // A header describing ~1 PB of weights reads instantly from the stream.
    let mut w = Writer::new();
    for i in 0..64 {
        w.add_zero_tensor(format!("t{i}"), &[1 << 20, 1 << 20, 16], GgmlType::Q8_0);
    }
    let mut header = Vec::new();
    // Write only the header: stop the writer's output at the data section.
    struct Cap<'a>(&'a mut Vec<u8>, usize);
    impl std::io::Write for Cap<'_> {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            if self.0.len() >= self.1 {
                return Err(std::io::Error::other("enough"));
            }
            self.0.extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let _ = w.write_to(Cap(&mut header, 8192));
    let h = read_header(&header[..]).unwrap();
    assert_eq!(h.tensors.len(), 64);
    assert_eq!(h.tensor_bytes(), 64 * (1u64 << 40) / 32 * 34 * 16);
    assert!(read_header_sized(&header[..], header.len() as u64).is_err());
}
