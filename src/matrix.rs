//! llama-swap's matrix router: a small set language over model ids and an
//! eviction-cost solver that decides which running models make room for a request.
//!
//! DSL: identifiers `[A-Za-z0-9_.-]+` (a var, else a model id), `&` (and), `|` (or,
//! binds looser than `&`), parentheses and `+set` (another set's alternatives).
//! Every set expands to alternatives; any subset of an alternative may run together.

use std::collections::{BTreeMap, BTreeSet, HashMap};

/// Most alternatives one set may expand to before compilation gives up.
pub const MAX_ALTERNATIVES: usize = 4096;

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
#[derive(Debug, Clone, PartialEq, Eq)]
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
        for (var, model) in vars {
            let valid_name = (1..=32).contains(&var.chars().count())
                && var
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '.' || c == '-');
            if !valid_name {
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
        // A model's cost is its own entry, else the highest among vars naming it.
        let mut costs = BTreeMap::new();
        for (key, &cost) in evict_costs {
            if cost <= 0 {
                return Err(format!(
                    "matrix evict_costs {key:?}: cost {cost} must be a positive integer"
                ));
            }
            if let Some(model) = vars.get(key) {
                let slot = costs.entry(model.clone()).or_insert(cost);
                *slot = (*slot).max(cost);
            } else if !models.contains(key) {
                return Err(format!(
                    "matrix evict_costs {key:?}: unknown var or model"
                ));
            }
        }
        for (key, &cost) in evict_costs {
            if !vars.contains_key(key) {
                costs.insert(key.clone(), cost);
            }
        }
        if sets.is_empty() {
            return Err("matrix: at least one set is required".into());
        }
        let mut sources = HashMap::new();
        for (name, dsl) in sets {
            if sources.insert(name.as_str(), dsl.as_str()).is_some() {
                return Err(format!("matrix set {name:?}: defined more than once"));
            }
        }
        let mut cx = Expander {
            vars,
            models,
            sources,
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

    fn cost_of(&self, model: &str) -> i64 {
        self.costs.get(model).copied().unwrap_or(1)
    }

    fn total(&self, models: &[String]) -> i64 {
        models
            .iter()
            .fold(0i64, |acc, m| acc.saturating_add(self.cost_of(m)))
    }

    /// Models to evict so that `target` can run next to what stays of `running`;
    /// plus the log line when something is evicted.
    pub fn solve(&self, target: &str, running: &BTreeSet<String>) -> Decision {
        if running.contains(target) {
            return Decision {
                evict: Vec::new(),
                set: None,
                cost: 0,
                log: None,
            };
        }
        let mut best: Option<(i64, &Set, &Combo)> = None;
        for set in &self.sets {
            for alt in set.alternatives.iter().filter(|a| a.contains(target)) {
                let cost = running
                    .iter()
                    .filter(|m| !alt.contains(*m))
                    .fold(0i64, |acc, m| acc.saturating_add(self.cost_of(m)));
                if best.is_none_or(|(c, _, _)| cost < c) {
                    best = Some((cost, set, alt));
                }
            }
        }
        let (evict, set, dsl, target_models): (Vec<String>, _, _, Vec<String>) = match best {
            Some((_, set, alt)) => (
                running.iter().filter(|m| !alt.contains(*m)).cloned().collect(),
                Some(set.name.clone()),
                set.dsl.as_str(),
                alt.iter().cloned().collect(),
            ),
            None => (
                running.iter().cloned().collect(),
                None,
                "",
                vec![target.to_string()],
            ),
        };
        let cost = self.total(&evict);
        let log = (!evict.is_empty()).then(|| {
            format!(
                "matrix: model={target} set={} dsl=\"{dsl}\" evict=[{}] target=[{}] cost={cost}",
                set.as_deref().unwrap_or("-"),
                evict.join(" "),
                target_models.join(" "),
            )
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
        self.err(self.pos, format!("syntax error: expected {expected}, found {found}"))
    }

    fn or(&mut self, cx: &mut Expander) -> Result<Vec<Combo>, String> {
        let mut alts = self.and(cx)?;
        while self.peek() == Some('|') {
            let at = self.pos;
            self.pos += 1;
            let rhs = self.and(cx)?;
            let mut seen: BTreeSet<Combo> = alts.iter().cloned().collect();
            alts.extend(rhs.into_iter().filter(|c| seen.insert(c.clone())));
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
            let mut seen = BTreeSet::new();
            let mut product = Vec::new();
            for l in &alts {
                for r in &rhs {
                    let combo: Combo = l.union(r).cloned().collect();
                    if seen.insert(combo.clone()) {
                        product.push(combo);
                    }
                }
            }
            alts = product;
        }
        Ok(alts)
    }

    fn atom(&mut self, cx: &mut Expander) -> Result<Vec<Combo>, String> {
        match self.peek() {
            Some('(') => {
                self.pos += 1;
                let inner = self.or(cx)?;
                if self.peek() != Some(')') {
                    return Err(self.unexpected("')'"));
                }
                self.pos += 1;
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
                let model = match cx.vars.get(&name) {
                    Some(model) => model.clone(),
                    None if cx.models.contains(&name) => name,
                    None => {
                        return Err(self.err(
                            at,
                            format!("unknown identifier {name:?} (not a var nor a model)"),
                        ))
                    }
                };
                Ok(vec![Combo::from([model])])
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

    fn s(v: &[&str]) -> BTreeSet<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    fn build(vars: &[(&str, &str)], costs: &[(&str, i64)], sets: &[(&str, &str)]) -> Result<Matrix, String> {
        let vars = vars.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        let costs = costs.iter().map(|(k, v)| (k.to_string(), *v)).collect();
        let sets: Vec<_> = sets.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        let models = s(&["a", "b", "c", "d", "e", "qwen-7b", "llama_3.1", "x:y"]);
        Matrix::compile(&vars, &costs, &sets, &models)
    }

    fn alts(dsl: &str) -> Vec<Vec<String>> {
        let m = build(&[], &[], &[("s", dsl)]).unwrap();
        m.sets[0].alternatives.iter().map(|c| c.iter().cloned().collect()).collect()
    }

    fn err(vars: &[(&str, &str)], costs: &[(&str, i64)], sets: &[(&str, &str)]) -> String {
        build(vars, costs, sets).unwrap_err()
    }

    #[test]
    fn precedence_and_parentheses() {
        assert_eq!(alts("a|b&c"), [vec!["a"], vec!["b", "c"]]);
        assert_eq!(alts("a & b | c"), [vec!["a", "b"], vec!["c"]]);
        assert_eq!(alts("a & (b | c)"), [vec!["a", "b"], vec!["a", "c"]]);
        assert_eq!(alts("(a|b) & (c|d)").len(), 4);
        assert_eq!(alts("a | a | (a & a)"), [vec!["a"]]);
        assert_eq!(alts(" llama_3.1&qwen-7b "), [vec!["llama_3.1", "qwen-7b"]]);
    }

    #[test]
    fn references_expand_and_cycles_fail() {
        let m = build(&[], &[], &[("s", "+other & d"), ("other", "a | b & c")]).unwrap();
        let got: Vec<Vec<String>> = m.sets[0].alternatives.iter().map(|c| c.iter().cloned().collect()).collect();
        assert_eq!(got, [vec!["a", "d"], vec!["b", "c", "d"]]);
        let e = err(&[], &[], &[("x", "a & +y"), ("y", "+z"), ("z", "b | +x")]);
        assert!(e.contains("reference cycle x -> y -> z -> x"), "{e}");
        assert!(err(&[], &[], &[("x", "a | +x")]).contains("cycle x -> x"));
        let e = err(&[], &[], &[("x", "a | +nope")]);
        assert!(e.contains("set \"x\"") && e.contains("undefined set reference \"+nope\" at position 6"), "{e}");
    }

    #[test]
    fn var_wins_over_model_and_names_unlisted_ids() {
        let m = build(&[("a", "b"), ("xy", "x:y")], &[], &[("s", "a & xy")]).unwrap();
        assert_eq!(m.sets[0].alternatives, [s(&["b", "x:y"])]);
    }

    #[test]
    fn subset_semantics_and_target_running() {
        let m = build(&[], &[], &[("s", "a & b & c")]).unwrap();
        let d = m.solve("a", &s(&["b"]));
        assert_eq!(d, Decision { evict: vec![], set: Some("s".into()), cost: 0, log: None });
        // Target already running: nothing evicted even though {a, d} is no combination.
        let d = m.solve("a", &s(&["a", "d"]));
        assert_eq!((d.evict.len(), d.set, d.log), (0, None, None));
    }

    #[test]
    fn minimises_cost_and_breaks_ties_by_order() {
        let m = build(
            &[("B", "b")],
            &[("B", 5), ("c", 2)],
            &[("first", "a & d | a & e"), ("second", "a & b"), ("third", "a & c")],
        )
        .unwrap();
        // Running b (5) and c (2): keeping b costs 2, keeping c costs 5.
        let d = m.solve("a", &s(&["b", "c"]));
        assert_eq!((d.evict, d.set.as_deref(), d.cost), (vec!["c".to_string()], Some("second"), 2));
        assert_eq!(
            d.log.unwrap(),
            "matrix: model=a set=second dsl=\"a & b\" evict=[c] target=[a b] cost=2"
        );
        // Equal costs: the first set, then its first alternative, wins.
        let d = m.solve("a", &s(&["d", "e"]));
        assert_eq!((d.evict, d.set.as_deref(), d.cost), (vec!["e".to_string()], Some("first"), 1));
        assert!(d.log.unwrap().contains("target=[a d]"));
    }

    #[test]
    fn target_in_no_set_evicts_everything() {
        let m = build(&[], &[("b", 3)], &[("s", "a & b")]).unwrap();
        let d = m.solve("e", &s(&["a", "b"]));
        assert_eq!((d.evict, d.set, d.cost), (vec!["a".to_string(), "b".to_string()], None, 4));
        assert_eq!(d.log.unwrap(), "matrix: model=e set=- dsl=\"\" evict=[a b] target=[e] cost=4");
        assert_eq!(m.solve("e", &BTreeSet::new()).log, None);
    }

    #[test]
    fn coexistence() {
        let m = build(&[], &[], &[("s", "a & (b | c)"), ("t", "d")]).unwrap();
        assert!(m.can_coexist(&["a", "b"]) && m.can_coexist(&["c", "a"]) && m.can_coexist(&["d"]));
        assert!(!m.can_coexist(&["b", "c"]) && !m.can_coexist(&["a", "d"]) && !m.can_coexist(&["e"]));
    }

    #[test]
    fn syntax_errors_name_the_position() {
        for (dsl, want) in [
            ("a &", "expected an identifier, '+set' or '(', found end of input at position 4"),
            ("a b", "expected '&', '|' or end of input, found 'b' at position 3"),
            ("(a | b", "expected ')', found end of input at position 7"),
            ("a | )", "found ')' at position 5"),
            ("a & + ", "expected a set name after '+'"),
            ("a ! b", "found '!' at position 3"),
        ] {
            let e = err(&[], &[], &[("s", dsl)]);
            assert!(e.starts_with("matrix set \"s\": syntax error") && e.contains(want), "{dsl}: {e}");
        }
    }

    #[test]
    fn validation_errors() {
        let e = err(&[], &[], &[("s", "a & zz")]);
        assert!(e.contains("unknown identifier \"zz\" (not a var nor a model) at position 5"), "{e}");
        assert!(err(&[], &[], &[]).contains("at least one set"));
        assert!(err(&[], &[], &[("s", "  ")]).contains("set \"s\": empty set"));
        assert!(err(&[], &[], &[("s", "a"), ("s", "b")]).contains("more than once"));
        for bad in ["", "has_underscore", "sp ace", &"v".repeat(33)] {
            assert!(err(&[(bad, "a")], &[], &[("s", "a")]).contains("invalid name"), "{bad}");
        }
        assert!(build(&[(&"v".repeat(32), "a")], &[], &[("s", "a")]).is_ok());
        assert!(err(&[("v", "alias")], &[], &[("s", "a")]).contains("not a model id"));
        assert!(err(&[], &[("a", 0)], &[("s", "a")]).contains("positive integer"));
        assert!(err(&[], &[("a", -3)], &[("s", "a")]).contains("positive integer"));
        assert!(err(&[], &[("nope", 2)], &[("s", "a")]).contains("unknown var or model"));
    }

    #[test]
    fn alternative_explosion_is_capped() {
        let dsl = vec!["(a | b | c | d | e)"; 6].join(" & ");
        // Unions collapse duplicates, so build distinct models per factor instead.
        let models: BTreeSet<String> = (0..26).map(|i| format!("m{i}")).collect();
        let factors: Vec<String> = (0..13).map(|i| format!("(m{} | m{})", 2 * i, 2 * i + 1)).collect();
        let sets = vec![("s".to_string(), factors.join(" & "))];
        let e = Matrix::compile(&BTreeMap::new(), &BTreeMap::new(), &sets, &models).unwrap_err();
        assert!(e.contains("more than 4096 alternatives"), "{e}");
        assert!(build(&[], &[], &[("s", &dsl)]).is_ok());
    }
}
