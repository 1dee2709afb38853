mod common;

use std::path::Path;

use common::TempDir;
use gguf::{parse_split_name, read_file, read_model, split_path, Error, GgmlType, Value, Writer};

fn model_writer(n_tensors: usize) -> Writer {
    let mut w = Writer::new();
    w.set("general.architecture", "llama")
        .set("llama.block_count", 7u32);
    for i in 0..n_tensors {
        w.add_tensor(
            format!("t{i}"),
            &[8, i as u64 + 1],
            GgmlType::F32,
            vec![i as u8; 32 * (i + 1)],
        );
    }
    w
}

#[test]
fn split_names_parse() {
    let p = |s: &str| parse_split_name(Path::new(s));
    assert_eq!(p("/m/x-00002-of-00005.gguf"), Some(("/m/x".into(), 2, 5)));
    assert_eq!(p("a-b-00001-of-00001.gguf"), Some(("a-b".into(), 1, 1)));
    assert_eq!(p("x-00006-of-00005.gguf"), None);
    assert_eq!(p("x-00000-of-00005.gguf"), None);
    assert_eq!(p("x-0001-of-00005.gguf"), None);
    assert_eq!(p("x-00001-of-00005.bin"), None);
    assert_eq!(p("-00001-of-00002.gguf"), None);
    assert_eq!(p("x.gguf"), None);
    assert_eq!(p("é-00001-of-00002.gguf"), Some(("é".into(), 1, 2)));
    assert_eq!(
        split_path("/m/x", 3, 12),
        Path::new("/m/x-00003-of-00012.gguf")
    );
}

#[test]
fn split_model_reads_all_parts_from_any_part() {
    let dir = TempDir::new("split");
    let prefix = dir.path().join("model");
    let w = model_writer(7);
    let paths = w.write_split(&prefix, 3).unwrap();
    assert_eq!(paths.len(), 3);
    assert!(paths[2].ends_with("model-00003-of-00003.gguf"));

    let first = read_file(&paths[0]).unwrap();
    assert_eq!(first.get("split.no"), Some(&Value::U16(0)));
    assert_eq!(first.get("split.count"), Some(&Value::U16(3)));
    assert_eq!(first.get("split.tensors.count"), Some(&Value::I32(7)));
    assert_eq!(first.arch_u64("block_count"), Some(7));
    let second = read_file(&paths[1]).unwrap();
    assert_eq!(
        second.architecture(),
        None,
        "metadata only in the first part"
    );
    assert_eq!(second.get_u64("split.no"), Some(1));

    for p in &paths {
        let m = read_model(p).unwrap();
        assert_eq!(m.parts.len(), 3);
        assert_eq!(m.tensors.len(), 7);
        let names: Vec<_> = m.tensors.iter().map(|t| t.name.clone()).collect();
        assert_eq!(names, (0..7).map(|i| format!("t{i}")).collect::<Vec<_>>());
        assert_eq!(m.tensor_bytes(), (1..=7).map(|i| 32 * i).sum::<u64>());
        assert_eq!(m.header.arch_u64("block_count"), Some(7));
        let on_disk: u64 = paths
            .iter()
            .map(|p| std::fs::metadata(p).unwrap().len())
            .sum();
        assert_eq!(m.file_size(), on_disk);
        assert_eq!(m.parts.iter().map(|p| p.n_tensors).sum::<usize>(), 7);
    }
}

#[test]
fn missing_part_is_named() {
    let dir = TempDir::new("missing");
    let paths = model_writer(4)
        .write_split(dir.path().join("m"), 4)
        .unwrap();
    std::fs::remove_file(&paths[2]).unwrap();
    match read_model(&paths[0]) {
        Err(
            e @ Error::MissingSplit {
                part: 3, count: 4, ..
            },
        ) => {
            let msg = e.to_string();
            assert!(
                msg.contains("split part 3 of 4 is missing")
                    && msg.contains("m-00003-of-00004.gguf"),
                "{msg}"
            );
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn inconsistent_parts_are_errors() {
    let dir = TempDir::new("mismatch");
    // Parts written as 2 files but renamed to claim 3 parts.
    let paths = model_writer(3)
        .write_split(dir.path().join("a"), 2)
        .unwrap();
    for (i, p) in paths.iter().enumerate() {
        std::fs::rename(
            p,
            split_path(&dir.path().join("b").to_string_lossy(), i as u32 + 1, 3),
        )
        .unwrap();
    }
    model_writer(1)
        .write_file(split_path(&dir.path().join("b").to_string_lossy(), 3, 3))
        .unwrap();
    let e = read_model(dir.path().join("b-00001-of-00003.gguf")).unwrap_err();
    assert!(
        e.to_string()
            .contains("split.count is U16(2) but the name says 3 parts"),
        "{e}"
    );

    // A split part under a plain name.
    let paths = model_writer(2)
        .write_split(dir.path().join("c"), 2)
        .unwrap();
    let plain = dir.path().join("plain.gguf");
    std::fs::rename(&paths[0], &plain).unwrap();
    let e = read_model(&plain).unwrap_err();
    assert!(e.to_string().contains("split.count is 2"), "{e}");

    // Same tensor in two parts.
    let d = dir.path().join("d").to_string_lossy().into_owned();
    let mut w = model_writer(1);
    w.set("split.count", 2u16).set("split.no", 0u16);
    w.write_file(split_path(&d, 1, 2)).unwrap();
    w.set("split.no", 1u16);
    w.write_file(split_path(&d, 2, 2)).unwrap();
    let e = read_model(split_path(&d, 1, 2)).unwrap_err();
    assert!(
        e.to_string()
            .contains("tensor 't0' is also in an earlier part"),
        "{e}"
    );

    // Wrong total tensor count.
    let e_dir = dir.path().join("e").to_string_lossy().into_owned();
    let paths = model_writer(3).write_split(&e_dir, 3).unwrap();
    let mut w = model_writer(0);
    w.set("split.no", 0u16)
        .set("split.count", 3u16)
        .set("split.tensors.count", 9i32);
    w.add_tensor("t0", &[8, 1], GgmlType::F32, vec![0; 32]);
    w.write_file(&paths[0]).unwrap();
    let e = read_model(&paths[0]).unwrap_err();
    assert!(
        e.to_string()
            .contains("split.tensors.count is I32(9) but the parts hold 3 tensors"),
        "{e}"
    );
}

#[test]
fn single_file_model() {
    let dir = TempDir::new("single");
    let p = dir.path().join("one.gguf");
    model_writer(2).write_file(&p).unwrap();
    let m = read_model(&p).unwrap();
    assert_eq!(m.parts.len(), 1);
    assert_eq!(m.tensors, m.header.tensors);
    assert_eq!(m.file_size(), std::fs::metadata(&p).unwrap().len());
    let e = read_model(dir.path().join("nope.gguf")).unwrap_err();
    assert!(e.to_string().contains("nope.gguf"), "{e}");
}
