//! llama-swap's matrix router: a small set language over model ids and an
//! eviction-cost solver that decides which running models make room for a request.
//!
//! DSL: identifiers `[A-Za-z0-9_.-]+` (a var, else a model id), `&` (and), `|` (or,
//! binds looser than `&`), parentheses and `+set` (another set's alternatives).
//! Every set expands to alternatives; any subset of an alternative may run together.

use std::collections::{BTreeMap, BTreeSet, HashMap};

/// Most alternatives one set may expand to before compilation gives up.
pub const MAX_ALTERNATIVES: usize = 4096;

/// Deepest parenthesis nesting accepted (keeps the recursive parser off the stack limit).
const MAX_DEPTH: usize = 64;

type Combo = BTreeSet<String>;

#[derive(Debug, Clone)]
struct Set {
    name: String,
    dsl: String,
    alternatives: Vec<Combo>,
}

/// A compiled `matrix:` block.
#[derive(Debug, Clone)]
pub struct Matrix {
    sets: Vec<Set>,
    /// Effective eviction cost per model id (absent: 1).
    costs: BTreeMap<String, i64>,
}

/// What [`Matrix::solve`] decided for one request.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Decision {
    /// Running models to stop, sorted.
    pub evict: Vec<String>,
    /// The set whose alternative was chosen; `None` when the target was already
    /// running or belongs to no set.
    pub set: Option<String>,
    /// Sum of the eviction costs of `evict`.
    pub cost: i64,
    /// `matrix: ...` line for the caller to log; only when something is evicted.
    pub log: Option<String>,
}

impl Matrix {
    /// vars: var -> model id; evict_costs: var-or-model -> cost; sets: ordered (name, dsl);
    /// models: the configured model ids (for validation).
    pub fn compile(
        vars: &BTreeMap<String, String>,
        evict_costs: &BTreeMap<String, i64>,
        sets: &[(String, String)],
        models: &BTreeSet<String>,
    ) -> Result<Matrix, String> {
        check_vars(vars, models)?;
        let costs = model_costs(vars, evict_costs, models)?;
        if sets.is_empty() {
            return Err("matrix: at least one set is required".into());
        }
        let mut cx = Expander {
            vars,
            models,
            sources: set_sources(sets)?,
            memo: HashMap::new(),
            stack: Vec::new(),
        };
        let mut compiled = Vec::with_capacity(sets.len());
        for (name, dsl) in sets {
            compiled.push(Set {
                name: name.clone(),
                dsl: dsl.clone(),
                alternatives: cx.expand(name)?,
            });
        }
        Ok(Matrix {
            sets: compiled,
            costs,
        })
    }

    fn total(&self, models: &[String]) -> i64 {
        let costs = models
            .iter()
            .map(|m| self.costs.get(m).copied().unwrap_or(1));
        costs.fold(0, i64::saturating_add)
    }

    /// Models to evict so that `target` can run next to what stays of `running`;
    /// plus the log line when something is evicted.
    pub fn solve(&self, target: &str, running: &BTreeSet<String>) -> Decision {
        if running.contains(target) {
            return Decision::default();
        }
        let outside = |keep: Option<&Combo>| -> Vec<String> {
            let out = running
                .iter()
                .filter(|m| keep.is_none_or(|k| !k.contains(*m)));
            out.cloned().collect()
        };
        let mut best: Option<(i64, &Set, &Combo)> = None;
        for set in &self.sets {
            for alt in set.alternatives.iter().filter(|a| a.contains(target)) {
                let cost = self.total(&outside(Some(alt)));
                if best.is_none_or(|(least, _, _)| cost < least) {
                    best = Some((cost, set, alt));
                }
            }
        }
        let evict = outside(best.map(|(_, _, alt)| alt));
        let cost = self.total(&evict);
        let (set, dsl, kept) = match best {
            Some((_, set, alt)) => (
                Some(set.name.clone()),
                set.dsl.as_str(),
                Vec::from_iter(alt.clone()),
            ),
            None => (None, "", vec![target.to_string()]),
        };
        let log = (!evict.is_empty()).then(|| {
            let name = set.as_deref().unwrap_or("-");
            let (evicted, kept) = (evict.join(" "), kept.join(" "));
            let head = format!("matrix: model={target} set={name} dsl=\"{dsl}\"");
            format!("{head} evict=[{evicted}] target=[{kept}] cost={cost}")
        });
        Decision {
            evict,
            set,
            cost,
            log,
        }
    }

    /// True when all of `models` can run together (some alternative contains them all).
    pub fn can_coexist(&self, models: &[&str]) -> bool {
        self.sets
            .iter()
            .flat_map(|s| &s.alternatives)
            .any(|alt| models.iter().all(|m| alt.contains(*m)))
    }
}

/// Each var's name is valid and names a configured model (not an alias).
fn check_vars(vars: &BTreeMap<String, String>, models: &BTreeSet<String>) -> Result<(), String> {
    for (var, model) in vars {
        let ok = |c: char| c.is_ascii_alphanumeric() || c == '.' || c == '-';
        if !(1..=32).contains(&var.len()) || !var.chars().all(ok) {
            return Err(format!(
                "matrix var {var:?}: invalid name (must match ^[a-zA-Z0-9.-]{{1,32}}$)"
            ));
        }
        if !models.contains(model) {
            return Err(format!(
                "matrix var {var:?}: {model:?} is not a model id (aliases are not allowed)"
            ));
        }
    }
    Ok(())
}

/// The eviction cost per model id: a model's own entry, else the highest among vars naming it.
fn model_costs(
    vars: &BTreeMap<String, String>,
    evict_costs: &BTreeMap<String, i64>,
    models: &BTreeSet<String>,
) -> Result<BTreeMap<String, i64>, String> {
    let mut costs = BTreeMap::new();
    for (key, &cost) in evict_costs {
        if cost <= 0 {
            return Err(format!(
                "matrix evict_costs {key:?}: cost {cost} must be a positive integer"
            ));
        }
        match vars.get(key) {
            Some(model) if evict_costs.contains_key(model) => {}
            Some(model) => {
                let slot = costs.entry(model.clone()).or_insert(cost);
                *slot = (*slot).max(cost);
            }
            None if models.contains(key) => _ = costs.insert(key.clone(), cost),
            None => return Err(format!("matrix evict_costs {key:?}: unknown var or model")),
        }
    }
    Ok(costs)
}

/// Each set's DSL by name; a name defined twice is refused.
fn set_sources(sets: &[(String, String)]) -> Result<HashMap<&str, &str>, String> {
    let mut sources = HashMap::new();
    for (name, dsl) in sets {
        if sources.insert(name.as_str(), dsl.as_str()).is_some() {
            return Err(format!("matrix set {name:?}: defined more than once"));
        }
    }
    Ok(sources)
}

struct Expander<'a> {
    vars: &'a BTreeMap<String, String>,
    models: &'a BTreeSet<String>,
    sources: HashMap<&'a str, &'a str>,
    memo: HashMap<String, Vec<Combo>>,
    stack: Vec<String>,
}

impl Expander<'_> {
    fn expand(&mut self, name: &str) -> Result<Vec<Combo>, String> {
        if let Some(done) = self.memo.get(name) {
            return Ok(done.clone());
        }
        if let Some(at) = self.stack.iter().position(|s| s == name) {
            let mut cycle = self.stack[at..].to_vec();
            cycle.push(name.to_string());
            return Err(format!(
                "matrix set {:?}: reference cycle {}",
                self.stack[at],
                cycle.join(" -> ")
            ));
        }
        let dsl = self.sources[name];
        if dsl.trim().is_empty() {
            return Err(format!("matrix set {name:?}: empty set"));
        }
        self.stack.push(name.to_string());
        let mut p = Parser {
            set: name.to_string(),
            chars: dsl.chars().collect(),
            pos: 0,
            depth: 0,
        };
        let alts = p.or(self)?;
        if p.peek().is_some() {
            return Err(p.unexpected("'&', '|' or end of input"));
        }
        self.stack.pop();
        self.memo.insert(name.to_string(), alts.clone());
        Ok(alts)
    }
}

struct Parser {
    set: String,
    chars: Vec<char>,
    pos: usize,
    depth: usize,
}

/// Keeps the first of equal combinations.
fn dedup(combos: impl Iterator<Item = Combo>) -> Vec<Combo> {
    let mut seen = BTreeSet::new();
    combos.filter(|c| seen.insert(c.clone())).collect()
}

fn is_ident(c: char) -> bool {
    c.is_alphanumeric() || matches!(c, '_' | '-' | '.')
}

impl Parser {
    /// Next non-blank character, skipping the blanks.
    fn peek(&mut self) -> Option<char> {
        while self.chars.get(self.pos).is_some_and(|c| c.is_whitespace()) {
            self.pos += 1;
        }
        self.chars.get(self.pos).copied()
    }

    fn err(&self, at: usize, what: String) -> String {
        format!("matrix set {:?}: {what} at position {}", self.set, at + 1)
    }

    fn unexpected(&mut self, expected: &str) -> String {
        let found = match self.peek() {
            Some(c) => format!("{c:?}"),
            None => "end of input".into(),
        };
        self.err(
            self.pos,
            format!("syntax error: expected {expected}, found {found}"),
        )
    }

    fn or(&mut self, cx: &mut Expander) -> Result<Vec<Combo>, String> {
        let mut alts = self.and(cx)?;
        while self.peek() == Some('|') {
            let at = self.pos;
            self.pos += 1;
            let rhs = self.and(cx)?;
            alts = dedup(alts.into_iter().chain(rhs));
            self.cap(alts.len(), at)?;
        }
        Ok(alts)
    }

    fn and(&mut self, cx: &mut Expander) -> Result<Vec<Combo>, String> {
        let mut alts = self.atom(cx)?;
        while self.peek() == Some('&') {
            let at = self.pos;
            self.pos += 1;
            let rhs = self.atom(cx)?;
            self.cap(alts.len().saturating_mul(rhs.len()), at)?;
            alts = dedup(alts.iter().flat_map(|l| rhs.iter().map(move |r| l | r)));
        }
        Ok(alts)
    }

    fn atom(&mut self, cx: &mut Expander) -> Result<Vec<Combo>, String> {
        match self.peek() {
            Some('(') => {
                self.depth += 1;
                if self.depth > MAX_DEPTH {
                    let what = format!("parentheses nested deeper than {MAX_DEPTH}");
                    return Err(self.err(self.pos, what));
                }
                self.pos += 1;
                let inner = self.or(cx)?;
                if self.peek() != Some(')') {
                    return Err(self.unexpected("')'"));
                }
                self.pos += 1;
                self.depth -= 1;
                Ok(inner)
            }
            Some('+') => {
                self.pos += 1;
                let at = self.pos;
                let name = self.ident();
                if name.is_empty() {
                    return Err(self.unexpected("a set name after '+'"));
                }
                if !cx.sources.contains_key(name.as_str()) {
                    return Err(self.err(at, format!("undefined set reference \"+{name}\"")));
                }
                cx.expand(&name)
            }
            Some(c) if is_ident(c) => {
                let at = self.pos;
                let name = self.ident();
                let var = cx.vars.get(&name).cloned();
                let model = var.or_else(|| cx.models.contains(&name).then(|| name.clone()));
                let what = || format!("unknown identifier {name:?} (not a var nor a model)");
                Ok(vec![Combo::from([
                    model.ok_or_else(|| self.err(at, what()))?
                ])])
            }
            _ => Err(self.unexpected("an identifier, '+set' or '('")),
        }
    }

    fn ident(&mut self) -> String {
        let start = self.pos;
        while self.chars.get(self.pos).is_some_and(|&c| is_ident(c)) {
            self.pos += 1;
        }
        self.chars[start..self.pos].iter().collect()
    }

    fn cap(&self, n: usize, at: usize) -> Result<(), String> {
        if n > MAX_ALTERNATIVES {
            return Err(self.err(
                at,
                format!("expands to more than {MAX_ALTERNATIVES} alternatives"),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type Pairs<'a, T> = &'a [(&'a str, T)];

    fn s(v: &[&str]) -> BTreeSet<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    fn build(vars: Pairs<&str>, costs: Pairs<i64>, sets: Pairs<&str>) -> Result<Matrix, String> {
        let own = |(k, v): &(&str, &str)| (k.to_string(), v.to_string());
        let vars = vars.iter().map(own).collect();
        let costs = costs.iter().map(|(k, v)| (k.to_string(), *v)).collect();
        let sets: Vec<_> = sets.iter().map(own).collect();
        let models = s(&["a", "b", "c", "d", "e", "qwen-7b", "llama_3.1", "x:y"]);
        Matrix::compile(&vars, &costs, &sets, &models)
    }

    fn err(vars: Pairs<&str>, costs: Pairs<i64>, sets: Pairs<&str>) -> String {
        build(vars, costs, sets).unwrap_err()
    }

    /// The alternatives of set `i`, written `a&b | c`.
    fn shown(m: &Matrix, i: usize) -> String {
        let alts = m.sets[i].alternatives.iter();
        let alts: Vec<String> = alts.map(|c| Vec::from_iter(c.clone()).join("&")).collect();
        alts.join(" | ")
    }

    fn alts(dsl: &str) -> String {
        shown(&build(&[], &[], &[("s", dsl)]).unwrap(), 0)
    }

    /// (evict, set, cost, log) of one decision.
    fn solved(m: &Matrix, target: &str, running: &[&str]) -> (String, String, i64, String) {
        let d = m.solve(target, &s(running));
        let set = d.set.unwrap_or_default();
        (d.evict.join(" "), set, d.cost, d.log.unwrap_or_default())
    }

    #[test]
    fn precedence_and_parentheses() {
        assert_eq!(alts("a|b&c"), "a | b&c");
        assert_eq!(alts("a & b | c"), "a&b | c");
        assert_eq!(alts("a & (b | c)"), "a&b | a&c");
        assert_eq!(alts("((a|b)) & (c|d)"), "a&c | a&d | b&c | b&d");
        assert_eq!(alts("a | a | (a & a)"), "a");
        assert_eq!(alts(" llama_3.1&qwen-7b "), "llama_3.1&qwen-7b");
    }

    #[test]
    fn references_expand_and_cycles_fail() {
        let m = build(&[], &[], &[("s", "+other & d"), ("other", "a | b & c")]).unwrap();
        assert_eq!(shown(&m, 0), "a&d | b&c&d");
        let e = err(&[], &[], &[("x", "a & +y"), ("y", "+z"), ("z", "b | +x")]);
        assert!(e.contains("\"x\": reference cycle x -> y -> z -> x"), "{e}");
        assert!(err(&[], &[], &[("x", "a | +x")]).contains("cycle x -> x"));
        let e = err(&[], &[], &[("x", "a | +nope")]);
        assert!(
            e.contains("undefined set reference \"+nope\" at position 6"),
            "{e}"
        );
    }

    #[test]
    fn var_wins_over_model_and_names_unlisted_ids() {
        let m = build(&[("a", "b"), ("xy", "x:y")], &[], &[("s", "a & xy")]).unwrap();
        assert_eq!(shown(&m, 0), "b&x:y");
    }

    #[test]
    fn subset_semantics_and_target_running() {
        let m = build(&[], &[], &[("s", "a & b & c")]).unwrap();
        let (evict, set, cost, log) = solved(&m, "a", &["b"]);
        assert_eq!((evict + &log, set.as_str(), cost), (String::new(), "s", 0));
        // Target already running: nothing evicted even though {a, d} is no combination.
        assert_eq!(m.solve("a", &s(&["a", "d"])), Decision::default());
    }

    #[test]
    fn minimises_cost_and_breaks_ties_by_order() {
        let sets = [
            ("first", "a&d | a&e"),
            ("second", "a & b"),
            ("third", "a&c"),
        ];
        let m = build(&[("B", "b")], &[("B", 5), ("c", 2)], &sets).unwrap();
        // Running b (5) and c (2): keeping b costs 2, keeping c costs 5.
        let (evict, set, cost, log) = solved(&m, "a", &["b", "c"]);
        assert_eq!((evict.as_str(), set.as_str(), cost), ("c", "second", 2));
        let want = "matrix: model=a set=second dsl=\"a & b\" evict=[c] target=[a b] cost=2";
        assert_eq!(log, want);
        // Equal costs: the first set, then its first alternative, wins.
        let (evict, set, cost, log) = solved(&m, "a", &["d", "e"]);
        assert_eq!((evict.as_str(), set.as_str(), cost), ("e", "first", 1));
        assert!(log.contains("target=[a d]"), "{log}");
    }

    #[test]
    fn target_in_no_set_evicts_everything() {
        let m = build(&[], &[("b", 3)], &[("s", "a & b")]).unwrap();
        let (evict, set, cost, log) = solved(&m, "e", &["a", "b"]);
        assert_eq!((evict.as_str(), set.as_str(), cost), ("a b", "", 4));
        let want = "matrix: model=e set=- dsl=\"\" evict=[a b] target=[e] cost=4";
        assert_eq!(log, want);
        assert_eq!(m.solve("e", &BTreeSet::new()), Decision::default());
    }

    #[test]
    fn coexistence() {
        let m = build(&[], &[], &[("s", "a & (b | c)"), ("t", "d")]).unwrap();
        let yes: [&[&str]; 4] = [&["a", "b"], &["c", "a"], &["d"], &[]];
        assert!(yes.iter().all(|models| m.can_coexist(models)));
        let no: [&[&str]; 3] = [&["b", "c"], &["a", "d"], &["e"]];
        assert!(no.iter().all(|models| !m.can_coexist(models)));
    }

    #[test]
    fn syntax_errors_name_the_position() {
        for (dsl, want) in [
            (
                "a &",
                "expected an identifier, '+set' or '(', found end of input at position 4",
            ),
            (
                "a b",
                "expected '&', '|' or end of input, found 'b' at position 3",
            ),
            ("(a | b", "expected ')', found end of input at position 7"),
            ("a | )", "found ')' at position 5"),
            ("a & + ", "expected a set name after '+'"),
            ("a ! b", "found '!' at position 3"),
        ] {
            let e = err(&[], &[], &[("s", dsl)]);
            let ok = e.starts_with("matrix set \"s\": syntax error") && e.contains(want);
            assert!(ok, "{dsl}: {e}");
        }
    }

    #[track_caller]
    fn fails(vars: Pairs<&str>, costs: Pairs<i64>, sets: Pairs<&str>, want: &str) {
        let e = err(vars, costs, sets);
        assert!(e.contains(want), "{want}: {e}");
    }

    #[test]
    fn validation_errors() {
        let (a, v) = (&[("s", "a")][..], &[("v", "a")][..]);
        let want = "\"s\": unknown identifier \"zz\" (not a var nor a model) at position 5";
        fails(&[], &[], &[("s", "a & zz")], want);
        fails(&[], &[], &[], "matrix: at least one set is required");
        fails(&[], &[], &[("s", "  ")], "set \"s\": empty set");
        fails(
            &[],
            &[],
            &[("s", "a"), ("s", "b")],
            "defined more than once",
        );
        fails(&[], &[], &[("s", "a"), ("t", "+u")], "\"t\": undefined set");
        for bad in ["", "has_underscore", "sp ace", &"v".repeat(33)] {
            fails(&[(bad, "a")], &[], a, &format!("var {bad:?}: invalid name"));
        }
        assert!(build(&[(&"v".repeat(32), "a")], &[], a).is_ok());
        fails(&[("v", "alias")], &[], a, "\"alias\" is not a model id");
        fails(&[], &[("a", 0)], a, "\"a\": cost 0 must be a positive");
        fails(
            v,
            &[("v", -3)],
            a,
            "\"v\": cost -3 must be a positive integer",
        );
        fails(v, &[("nope", 2)], a, "\"nope\": unknown var or model");
    }

    #[test]
    fn alternative_explosion_is_capped() {
        // 2^13 distinct combinations of 26 models: over the cap.
        let models: BTreeSet<String> = (0..26).map(|i| format!("m{i}")).collect();
        let factors = Vec::from_iter((0..13).map(|i| format!("(m{} | m{})", 2 * i, 2 * i + 1)));
        let sets = [("s".to_string(), factors.join(" & "))];
        let e = Matrix::compile(&BTreeMap::new(), &BTreeMap::new(), &sets, &models).unwrap_err();
        assert!(e.contains("more than 4096 alternatives"), "{e}");
        // Duplicate combinations collapse, so repeated factors stay small.
        let m = build(&[], &[], &[("s", &["(a | b | c | d | e)"; 6].join(" & "))]).unwrap();
        assert_eq!(m.sets[0].alternatives.len(), 31);
        let nested = |n| format!("{}a{}", "(".repeat(n), ")".repeat(n));
        assert_eq!(alts(&nested(64)), "a");
        let e = err(&[], &[], &[("s", &nested(10_000))]);
        assert!(e.contains("nested deeper than 64 at position 65"), "{e}");
    }
}
