//! Which GGUF files of a repository make a model: the file of the asked quantization, its split
//! parts, and a multimodal projector if the repository has one. Pure functions over file names,
//! used on the Hub's listing and on a cached snapshot alike.

use std::collections::BTreeMap;
use std::sync::LazyLock;

use regex::Regex;

/// The files a model needs, as paths within the repository.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Pick {
    /// The file to hand the engine: the only file, or the first part of a split.
    pub model: String,
    /// Every part (the model itself included).
    pub parts: Vec<String>,
    pub mmproj: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum PickError {
    /// No file of that quantization; the quantizations there are.
    NoQuant(Vec<String>),
    /// Several models and none asked for; the quantizations there are.
    Ambiguous(Vec<String>),
}

static SPLIT: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"^(.*)-(\d{5})-of-(\d{5})\.gguf$").expect("valid regex"));
static QUANT: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"(?i)^(u?i?q\d+(_[a-z0-9]+)*|tq\d_\d|bf16|fp?16|fp?32|fp8|mxfp4(_moe)?)$")
        .expect("valid regex")
});

fn is_gguf(name: &str) -> bool {
    name.to_ascii_lowercase().ends_with(".gguf")
}

fn is_mmproj(name: &str) -> bool {
    let base = name.rsplit('/').next().unwrap_or(name).to_ascii_lowercase();
    base.contains("mmproj")
}

/// The quantization written in a file's name (`Qwen3-8B-Q4_K_M.gguf` → `Q4_K_M`).
pub(crate) fn quant_of(name: &str) -> Option<String> {
    let base = name.rsplit('/').next().unwrap_or(name);
    let stem = SPLIT
        .captures(base)
        .map_or(base, |c| c.get(1).map_or(base, |m| m.as_str()));
    let stem = stem
        .strip_suffix(".gguf")
        .or(stem.strip_suffix(".GGUF"))
        .unwrap_or(stem);
    tokens(stem)
        .filter(|t| QUANT.is_match(t))
        .last()
        .map(|t| t.to_ascii_uppercase())
}

fn tokens(s: &str) -> impl Iterator<Item = &str> {
    s.split(['-', '.', '/']).filter(|t| !t.is_empty())
}

/// The split parts of `first` found in `files`, or just `first` when it is not split.
pub(crate) fn parts_of(first: &str, files: &[&str]) -> Vec<String> {
    let Some(c) = SPLIT.captures(first) else {
        return vec![first.to_string()];
    };
    let (prefix, count) = (&c[1], &c[3]);
    let n: u32 = count.parse().unwrap_or(1);
    (1..=n)
        .map(|i| format!("{prefix}-{i:05}-of-{count}.gguf"))
        .filter(|p| files.contains(&p.as_str()) || p == first)
        .collect()
}

/// How many parts a split name says there are (1 for a single file).
pub(crate) fn part_count(name: &str) -> usize {
    SPLIT
        .captures(name)
        .and_then(|c| c[3].parse().ok())
        .unwrap_or(1)
}

/// Picks the model among `files` (every path of a repository or snapshot).
pub(crate) fn pick(files: &[&str], quant: Option<&str>) -> Result<Pick, PickError> {
    let sets = model_sets(files);
    let available = || quants_of(&sets);
    let chosen = match quant {
        Some(q) => sets.values().copied().find(|f| {
            let stem = f.strip_suffix(".gguf").unwrap_or(f);
            quant_of(f).is_some_and(|x| x.eq_ignore_ascii_case(q))
                || tokens(stem).any(|t| t.eq_ignore_ascii_case(q))
        }),
        None if sets.len() == 1 => sets.values().next().copied(),
        None => return Err(PickError::Ambiguous(available())),
    };
    let Some(first) = chosen else {
        return Err(PickError::NoQuant(available()));
    };
    Ok(Pick {
        model: first.to_string(),
        parts: parts_of(first, files),
        mmproj: pick_mmproj(files, quant),
    })
}

/// The models among `files` (GGUFs that are no projector), each split's parts as one: by the
/// name they share, the first file of each.
fn model_sets<'a>(files: &[&'a str]) -> BTreeMap<String, &'a str> {
    let mut sets: BTreeMap<String, &str> = BTreeMap::new();
    for f in files
        .iter()
        .copied()
        .filter(|f| is_gguf(f) && !is_mmproj(f))
    {
        let key = SPLIT
            .captures(f)
            .map_or(f.to_string(), |c| c[1].to_string());
        let first = sets.entry(key).or_insert(f);
        if f < *first {
            *first = f;
        }
    }
    sets
}

/// The quantizations the models are in, sorted, each once: what an error offers to choose from.
fn quants_of(sets: &BTreeMap<String, &str>) -> Vec<String> {
    let mut q: Vec<String> = sets.values().filter_map(|f| quant_of(f)).collect();
    q.sort();
    q.dedup();
    q
}

/// The projector to load with the model: the one of the same quantization, else F16, else BF16,
/// else the first by name.
fn pick_mmproj(files: &[&str], quant: Option<&str>) -> Option<String> {
    let mut all: Vec<&str> = files
        .iter()
        .copied()
        .filter(|f| is_gguf(f) && is_mmproj(f))
        .collect();
    all.sort();
    let with = |q: &str| {
        all.iter()
            .find(|f| quant_of(f).is_some_and(|x| x.eq_ignore_ascii_case(q)))
            .copied()
    };
    quant
        .and_then(with)
        .or_else(|| with("F16"))
        .or_else(|| with("BF16"))
        .or_else(|| all.first().copied())
        .map(str::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;

    const REPO: &[&str] = &[
        "README.md",
        "Tiny-Q4_K_M.gguf",
        "Q8_0/Tiny-Q8_0-00001-of-00003.gguf",
        "Q8_0/Tiny-Q8_0-00002-of-00003.gguf",
        "Q8_0/Tiny-Q8_0-00003-of-00003.gguf",
        "mmproj-Tiny-BF16.gguf",
        "mmproj-Tiny-F16.gguf",
    ];

    #[test]
    fn quant_names_are_read_from_file_names() {
        assert_eq!(quant_of("Qwen3-8B-Q4_K_M.gguf").as_deref(), Some("Q4_K_M"));
        assert_eq!(
            quant_of("a/gemma-3-4b-it-UD-IQ2_XXS-00001-of-00002.gguf").as_deref(),
            Some("IQ2_XXS")
        );
        assert_eq!(quant_of("model.f16.gguf").as_deref(), Some("F16"));
        assert_eq!(quant_of("model.gguf"), None);
    }

    #[test]
    fn a_single_file_quant_and_the_f16_projector() {
        let p = pick(REPO, Some("q4_k_m")).unwrap();
        assert_eq!(p.model, "Tiny-Q4_K_M.gguf");
        assert_eq!(p.parts, vec!["Tiny-Q4_K_M.gguf"]);
        assert_eq!(p.mmproj.as_deref(), Some("mmproj-Tiny-F16.gguf"));
    }

    #[test]
    fn a_split_quant_brings_every_part() {
        let p = pick(REPO, Some("Q8_0")).unwrap();
        assert_eq!(p.model, "Q8_0/Tiny-Q8_0-00001-of-00003.gguf");
        assert_eq!(p.parts.len(), 3);
        assert_eq!(p.parts[2], "Q8_0/Tiny-Q8_0-00003-of-00003.gguf");
    }

    #[test]
    fn a_missing_quant_lists_those_there_are() {
        assert_eq!(
            pick(REPO, Some("Q2_K")),
            Err(PickError::NoQuant(vec!["Q4_K_M".into(), "Q8_0".into()]))
        );
        assert_eq!(
            pick(REPO, None),
            Err(PickError::Ambiguous(vec!["Q4_K_M".into(), "Q8_0".into()]))
        );
        let one = pick(&["m.gguf", "README.md"], None).unwrap();
        assert_eq!((one.model.as_str(), one.mmproj), ("m.gguf", None));
    }

    #[test]
    fn missing_parts_are_left_out_so_a_cache_check_sees_them_missing() {
        let files = ["m-00001-of-00002.gguf"];
        assert_eq!(parts_of(files[0], &files), vec!["m-00001-of-00002.gguf"]);
        assert_eq!(part_count(files[0]), 2);
    }
}
