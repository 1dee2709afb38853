mod common;

use common::{bytes_of, every_value, small_writer, TempDir};
use gguf::{
    read_file, read_header, read_header_sized, Array, Error, GgmlType, Value, ValueType, Writer,
};

#[test]
fn every_value_type_round_trips_in_v2_and_v3() {
    for version in [2, 3] {
        let bytes = bytes_of(&small_writer(version));
        let h = read_header(&bytes[..]).unwrap();
        assert_eq!(h.version, version);
        let mut expected = vec![
            ("general.architecture".to_string(), Value::from("llama")),
            ("llama.block_count".to_string(), Value::U32(2)),
        ];
        expected.extend(every_value());
        assert_eq!(h.metadata, expected, "file order and values, v{version}");
        let sized = read_header_sized(&bytes[..], bytes.len() as u64).unwrap();
        assert_eq!(sized, h);
    }
}

#[test]
fn accessors_convert_between_integer_types() {
    let h = read_header(&bytes_of(&small_writer(3))[..]).unwrap();
    assert_eq!(h.architecture(), Some("llama"));
    assert_eq!(h.arch_u64("block_count"), Some(2));
    assert_eq!(h.arch_u64("missing"), None);
    assert_eq!(h.get_u64("t.u8"), Some(200));
    assert_eq!(h.get_u64("t.i8"), None, "negative is not a u64");
    assert_eq!(h.get_i64("t.i8"), Some(-100));
    assert_eq!(h.get_u64("t.u64"), Some(u64::MAX));
    assert_eq!(h.get_i64("t.u64"), None);
    assert_eq!(h.get_f64("t.f32"), Some(f64::from(1.5e-3f32)));
    assert_eq!(h.get_f64("t.u16"), Some(60000.0));
    assert_eq!(h.get_bool("t.bool.true"), Some(true));
    assert_eq!(h.get_str("t.str"), Some("héllo ✓"));
    assert_eq!(h.get_str("t.u8"), None);
    let a = h.get_array("a.str").unwrap();
    assert_eq!(a.elem_type(), ValueType::String);
    assert_eq!(a.len(), 3);
    assert_eq!(a.get(2), Some(Value::String("ü".into())));
    assert_eq!(a.as_strings().unwrap()[0], "a");
    let nested = h.get_array("a.nested").unwrap();
    assert_eq!(nested.elem_type(), ValueType::Array);
    match nested.get(2) {
        Some(Value::Array(Array::Array(inner))) => assert_eq!(inner[0], Array::U8(vec![9])),
        other => panic!("unexpected {other:?}"),
    }
    assert!(h.get_array("a.empty").unwrap().is_empty());
    assert_eq!(h.get_array("a.empty").unwrap().elem_type(), ValueType::F32);
}

#[test]
fn tensors_offsets_and_data_offset() {
    let bytes = bytes_of(&small_writer(3));
    let h = read_header(&bytes[..]).unwrap();
    assert_eq!(h.alignment, 32);
    assert_eq!(h.data_offset % 32, 0);
    let names: Vec<_> = h.tensors.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["a", "b", "c"]);
    let a = h.tensor("a").unwrap();
    assert_eq!(
        (a.dims.as_slice(), a.ggml_type, a.offset, a.n_bytes),
        (&[4u64, 2][..], GgmlType::F32, 0, 32)
    );
    let b = h.tensor("b").unwrap();
    assert_eq!((b.offset, b.n_bytes), (32, 6));
    let c = h.tensor("c").unwrap();
    assert_eq!((c.offset, c.n_bytes, c.n_elements()), (64, 36, 64));
    assert_eq!(h.tensor_bytes(), 32 + 6 + 36);
    assert_eq!(h.n_elements(), 8 + 3 + 64);
    // The data really is where the header says.
    let at = (h.data_offset + c.offset) as usize;
    assert_eq!(&bytes[at..at + 36], &[3u8; 36][..]);
    assert_eq!(bytes[(h.data_offset + b.offset) as usize], 2);
    assert_eq!(
        bytes.len() as u64,
        h.data_offset + 64 + 64,
        "each tensor padded to 32"
    );
}

#[test]
fn custom_alignment_is_honoured() {
    let mut w = Writer::new();
    w.set_alignment(128)
        .add_tensor("x", &[3], GgmlType::F32, vec![0; 12])
        .add_tensor("y", &[5], GgmlType::I8, vec![7; 5]);
    let bytes = bytes_of(&w);
    let h = read_header(&bytes[..]).unwrap();
    assert_eq!(h.alignment, 128);
    assert_eq!(h.data_offset % 128, 0);
    assert_eq!(h.tensor("y").unwrap().offset, 128);
    assert_eq!(bytes[(h.data_offset + 128) as usize], 7);
}

#[test]
fn no_tensors_means_no_padding() {
    let mut w = Writer::new();
    w.set("k", 1u8);
    let bytes = bytes_of(&w);
    let h = read_header(&bytes[..]).unwrap();
    assert_eq!(h.data_offset, bytes.len() as u64);
    assert!(h.tensors.is_empty());
    assert_eq!(h.tensor_bytes(), 0);
}

#[test]
fn bad_alignment_is_rejected() {
    for v in [Value::U32(48), Value::U32(0), Value::U64(32)] {
        let mut w = Writer::new();
        w.set("general.alignment", v.clone());
        let e = read_header(&bytes_of(&w)[..]).unwrap_err();
        assert!(e.to_string().contains("general.alignment"), "{v:?}: {e}");
    }
}

#[test]
fn tensor_byte_sizes_follow_ggml_traits() {
    let cases: &[(GgmlType, &[u64], u64)] = &[
        (GgmlType::F32, &[10, 3], 120),
        (GgmlType::F16, &[10, 3], 60),
        (GgmlType::BF16, &[7], 14),
        (GgmlType::F64, &[2, 2, 2, 2], 128),
        (GgmlType::I8, &[5], 5),
        (GgmlType::Q4_0, &[64, 2], 72),
        (GgmlType::Q4_1, &[32], 20),
        (GgmlType::Q5_0, &[32], 22),
        (GgmlType::Q5_1, &[32], 24),
        (GgmlType::Q8_0, &[4096, 4096], 4096 / 32 * 34 * 4096),
        (GgmlType::Q8_1, &[32], 36),
        (GgmlType::Q2_K, &[256], 84),
        (GgmlType::Q3_K, &[256], 110),
        (GgmlType::Q4_K, &[512, 3], 2 * 144 * 3),
        (GgmlType::Q5_K, &[256], 176),
        (GgmlType::Q6_K, &[256], 210),
        (GgmlType::Q8_K, &[256], 292),
        (GgmlType::IQ2_XXS, &[256], 66),
        (GgmlType::IQ2_XS, &[256], 74),
        (GgmlType::IQ2_S, &[256], 82),
        (GgmlType::IQ3_XXS, &[256], 98),
        (GgmlType::IQ3_S, &[256], 110),
        (GgmlType::IQ1_S, &[256], 50),
        (GgmlType::IQ1_M, &[256], 56),
        (GgmlType::IQ4_NL, &[32], 18),
        (GgmlType::IQ4_XS, &[256], 136),
        (GgmlType::TQ1_0, &[256], 54),
        (GgmlType::TQ2_0, &[256], 66),
        (GgmlType::MXFP4, &[32], 17),
        (GgmlType::NVFP4, &[64], 36),
        (GgmlType::Q1_0, &[128], 18),
        (GgmlType::Q2_0, &[64], 18),
        (GgmlType::Q4_K, &[256, 0], 0),
    ];
    for &(ty, dims, bytes) in cases {
        assert_eq!(ty.bytes_for(dims), Some(bytes), "{ty} {dims:?}");
        let mut w = Writer::new();
        w.add_zero_tensor("t", dims, ty);
        let h = read_header(&bytes_of(&w)[..]).unwrap();
        assert_eq!(h.tensors[0].n_bytes, bytes, "{ty} via header");
        assert_eq!(GgmlType::from_id(ty.id()), Some(ty));
    }
    assert_eq!(GgmlType::Q4_K.bytes_for(&[100]), None, "not whole blocks");
    for id in [4, 5, 31, 32, 33, 36, 37, 38, 43, 1000] {
        assert_eq!(GgmlType::from_id(id), None, "{id}");
    }
    assert_eq!(GgmlType::ALL.len(), 35);
}

#[test]
fn unknown_tensor_type_and_partial_blocks_are_errors() {
    let mut w = Writer::new();
    w.add_tensor("t", &[4], GgmlType::F32, vec![0; 16]);
    let mut bytes = bytes_of(&w);
    // Header, name "t", n_dims, one dim, type, offset: the type id sits 12
    // bytes before the end of the only tensor info.
    let info_end = 24 + 8 + 1 + 4 + 8 + 4 + 8;
    bytes[info_end - 12..info_end - 8].copy_from_slice(&31u32.to_le_bytes());
    match read_header(&bytes[..]) {
        Err(Error::UnknownTensorType {
            tensor,
            type_id: 31,
            offset,
        }) => {
            assert_eq!(tensor, "t");
            assert_eq!(offset, (info_end - 12) as u64);
        }
        other => panic!("{other:?}"),
    }
    bytes[info_end - 12..info_end - 8].copy_from_slice(&(GgmlType::Q8_0.id()).to_le_bytes());
    let e = read_header(&bytes[..]).unwrap_err();
    assert!(e.to_string().contains("not whole q8_0 blocks"), "{e}");
}

#[test]
fn versions_other_than_2_and_3_are_rejected() {
    for v in [0, 1, 4, 0x0300_0000] {
        let bytes = bytes_of(&Writer::with_version(v));
        match read_header(&bytes[..]) {
            Err(e @ Error::UnsupportedVersion { .. }) => {
                if v == 1 {
                    assert!(e.to_string().contains("version 1 is not supported"), "{e}");
                }
            }
            other => panic!("v{v}: {other:?}"),
        }
    }
    let e = read_header(&b"GGML\x03\0\0\0"[..]).unwrap_err();
    assert!(matches!(e, Error::BadMagic { .. }), "{e}");
}

#[test]
fn zero_tensors_are_sparse_and_read_file_checks_size() {
    let dir = TempDir::new("sparse");
    let path = dir.path().join("big.gguf");
    let mut w = Writer::new();
    w.set("general.architecture", "llama");
    // 8 GiB of Q4_K "weights", written as a hole.
    w.add_zero_tensor("big", &[65536, 131072], GgmlType::Q4_K);
    w.add_tensor("small", &[2], GgmlType::F32, vec![1; 8]);
    w.write_file(&path).unwrap();
    let h = read_file(&path).unwrap();
    assert_eq!(h.tensor("big").unwrap().n_bytes, 65536 / 256 * 144 * 131072);
    assert_eq!(
        std::fs::metadata(&path).unwrap().len(),
        h.data_end().next_multiple_of(32)
    );
    // Cutting the file short makes read_file fail with the tensor's name.
    let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    f.set_len(h.data_end() - 1).unwrap();
    let e = read_file(&path).unwrap_err();
    assert!(
        e.to_string().contains("tensor 'small'") && e.to_string().contains("big.gguf"),
        "{e}"
    );
}

#[test]
fn writer_rejects_wrong_data_length() {
    let mut w = Writer::new();
    w.add_tensor("t", &[4], GgmlType::F32, vec![0; 15]);
    assert!(w.write_to(Vec::new()).is_err());
}
