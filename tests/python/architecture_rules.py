"""Tests of scripts/architecture.py on small trees written to temporary folders.

Run with `python3 scripts/architecture.py --self-test` (or `python3 -m unittest
tests/python/architecture_rules.py` from the repository's root).
"""

import contextlib
import importlib.util
import io
import json
import sys
import tempfile
import textwrap
import unittest
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "architecture.py"
SPEC = importlib.util.spec_from_file_location("architecture", SCRIPT)
arch = importlib.util.module_from_spec(SPEC)
sys.modules["architecture"] = arch  # dataclasses look their module up there
SPEC.loader.exec_module(arch)

MANIFEST = '[package]\nname = "demo"\nversion = "0.1.0"\n'


class Fixture(unittest.TestCase):
    """A test that writes a repository of Rust files and measures it."""

    def write(self, files: dict[str, str]) -> Path:
        """Writes files (path -> text, dedented) under a fresh folder, with a Cargo.toml."""
        holder = tempfile.TemporaryDirectory()
        self.addCleanup(holder.cleanup)
        root = Path(holder.name)
        files = {"Cargo.toml": MANIFEST, **files}
        for name, text in files.items():
            path = root / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(textwrap.dedent(text).lstrip("\n"))
        return root

    def folder_edges(self, root: Path) -> set[tuple[str, str, str]]:
        folders, _ = arch.build_graphs(arch.Tree(root))
        return {(g.name, a, b) for g in folders.values() for a, b in g.edges}

    def room_edges(self, root: Path) -> set[tuple[str, str]]:
        _, rooms = arch.build_graphs(arch.Tree(root))
        return set(rooms.edges)

    def run_main(self, root: Path, *args: str) -> tuple[int, str]:
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            code = arch.main(["--root", str(root), *args])
        return code, out.getvalue()


class Literals(unittest.TestCase):
    def test_comments_strings_and_chars_are_blanked_and_offsets_kept(self):
        text = textwrap.dedent(
            """
            // crate::a::X
            /* outer /* crate::b::X */ still comment crate::c::X */
            /// doc crate::d::X
            let s = "crate::e::X \\" crate::f::X";
            let r = r#"crate::g::X "quoted" "#;
            let b = br"crate::h::X";
            let c = ('{', '\\'', b'}', '\\u{7d}');
            fn f<'a>(x: &'a str) -> crate::real::Y {}
            """
        )
        code = arch.strip_literals(text)
        self.assertEqual(len(code), len(text))
        self.assertEqual(code.count("\n"), text.count("\n"))
        self.assertEqual([m.group() for m in arch.CODE_PATH.finditer(code)], ["crate::real::Y"])
        self.assertEqual(code.count("{"), code.count("}"))
        self.assertIn("'a str", code)

    def test_cfg_test_items_are_removed_with_their_lines(self):
        code = textwrap.dedent(
            """
            fn kept() {}
            #[cfg(test)]
            mod tests {
                fn inner() { let a = [0u8; 3]; }
            }
            #[cfg(test)]
            #[path = "x_tests.rs"]
            mod more;
            impl S {
                #[cfg(test)]
                fn helper(&self) -> [u8; 2] { [0; 2] }
                fn also_kept(&self) {}
            }
            struct S {
                #[cfg(test)]
                pub(crate) probe: HashMap<u8, Box<dyn Fn(u8) -> u8>>,
                kept_field: u8,
                #[cfg(test)]
                last: u8
            }
            """
        )
        stripped, removed = arch.remove_test_items(arch.strip_literals(code))
        self.assertEqual(removed, 13)
        self.assertNotIn("probe", stripped)
        self.assertNotIn("last", stripped)
        self.assertIn("kept_field", stripped)
        self.assertEqual(stripped.count("{"), stripped.count("}"))
        self.assertNotIn("inner", stripped)
        self.assertNotIn("more", stripped)
        self.assertNotIn("helper", stripped)
        self.assertIn("also_kept", stripped)
        self.assertIn("fn kept", stripped)


class UseTrees(unittest.TestCase):
    def leaves(self, tree: str):
        code = f"use {tree};"
        return [(s, alias, glob) for s, alias, glob, _ in
                arch.parse_use_tree(code, 4, arch.use_end(code, 4))]

    def test_braces_nesting_self_globs_and_renames(self):
        self.assertEqual(
            self.leaves("crate::{a::{self, X as Y, b::{Z}}, c::*, d as _}"),
            [
                (["crate", "a"], "a", False),
                (["crate", "a", "X"], "Y", False),
                (["crate", "a", "b", "Z"], "Z", False),
                (["crate", "c"], None, True),
                (["crate", "d"], None, False),
            ],
        )

    def test_self_with_rename_and_leading_colons(self):
        self.assertEqual(
            self.leaves("super::meter::{self as m}"), [(["super", "meter"], "m", False)]
        )
        self.assertEqual(self.leaves("::std::fmt"), [(["::", "std", "fmt"], "fmt", False)])


class Resolution(Fixture):
    def test_paths_in_code_follow_super_self_children_and_imported_modules(self):
        root = self.write({
            "src/lib.rs": "mod top;\n",
            "src/top/mod.rs": "mod a; mod b; mod c; mod d; mod e; mod f;\n",
            "src/top/a.rs": """
                use super::meter_alias_is_not_a_module;
                use super::b;
                fn f() { b::Thing::new(); }
                """,
            "src/top/b.rs": "pub struct Thing;\nfn g() { super::c::h(); }\n",
            "src/top/c.rs": "pub fn h() { crate::top::d::x(); }\n",
            "src/top/d.rs": "mod inner;\npub fn x() {}\nfn y() { inner::z(); self::inner::z(); }\n",
            "src/top/d/inner.rs": "pub fn z() { super::super::e::w(); }\n",
            "src/top/e.rs": "use super::f as renamed;\npub fn w() { renamed::v(); }\n",
            "src/top/f.rs": "pub fn v() {}\n",
        })
        self.assertEqual(
            self.folder_edges(root),
            {
                ("src/top", "a", "b"),
                ("src/top", "b", "c"),
                ("src/top", "c", "d"),
                ("src/top", "d", "e"),
                ("src/top", "e", "f"),
            },
        )

    def test_reexports_are_followed_to_the_defining_module(self):
        root = self.write({
            "src/lib.rs": "mod top;\n",
            "src/top/mod.rs": """
                mod x; mod y; mod w; mod v; mod z;
                pub use x::{A, B};
                pub(crate) use y::*;
                pub(super) use w::Far;
                pub fn own() {}
                """,
            "src/top/x.rs": "pub struct A; pub struct B;\n",
            "src/top/y.rs": "pub struct C;\n",
            "src/top/w.rs": "pub use super::v::Far;\n",
            "src/top/v.rs": "pub struct Far;\n",
            "src/top/z.rs": """
                use super::{A, own};
                fn f() -> super::C { crate::top::Far; super::B; own() }
                """,
        })
        self.assertEqual(
            self.folder_edges(root),
            {
                ("src/top", "z", "x"),
                ("src/top", "z", "y"),
                ("src/top", "z", "v"),
                ("src/top", "w", "v"),
            },
        )

    def test_a_file_and_its_folder_are_one_node_and_faces_draw_no_arrow(self):
        root = self.write({
            "src/lib.rs": "mod top;\n",
            "src/top/mod.rs": "mod x;\nmod y;\npub struct Shared;\n",
            "src/top/x.rs": "mod inner;\npub struct G;\nfn f() -> super::Shared {}\n",
            "src/top/x/inner.rs": "use crate::top::y::F;\nuse super::G;\n",
            "src/top/y.rs": "pub struct F;\nuse crate::top::x::G;\n",
        })
        self.assertEqual(self.folder_edges(root), {("src/top", "x", "y"), ("src/top", "y", "x")})
        report = arch.measure(root, root / "ARCHITECTURE.md")
        [circle] = report["circles"]
        self.assertEqual(circle["folder"], "src/top")
        self.assertEqual(circle["nodes"], ["x", "y"])
        self.assertEqual(circle["rings"], [["x", "y", "x"]])
        examples = {(e["from"], e["to"]): e["example"] for e in circle["edges"]}
        self.assertEqual(examples[("x", "y")], "src/top/x/inner.rs:1 `crate::top::y::F`")
        self.assertEqual(examples[("y", "x")], "src/top/y.rs:2 `crate::top::x::G`")

    def test_inline_modules_belong_to_their_file_and_resolve_super_from_inside(self):
        root = self.write({
            "src/lib.rs": "mod top;\n",
            "src/top/mod.rs": "mod x;\nmod y;\n",
            "src/top/x.rs": "mod inner {\n    use super::super::y::F;\n}\n",
            "src/top/y.rs": "pub struct F;\n",
        })
        self.assertEqual(self.folder_edges(root), {("src/top", "x", "y")})

    def test_path_attributes_are_followed(self):
        root = self.write({
            "src/lib.rs": "mod top;\n",
            "src/top/mod.rs": '#[path = "elsewhere.rs"]\nmod x;\nmod y;\n',
            "src/top/elsewhere.rs": "use super::y::F;\n",
            "src/top/y.rs": "pub struct F;\n",
        })
        tree = arch.Tree(root)
        self.assertIn("src/top/elsewhere.rs", {f.rel for f in tree.files})
        self.assertEqual(self.folder_edges(root), {("src/top", "x", "y")})

    def test_glob_imports_bring_bare_names(self):
        root = self.write({
            "src/lib.rs": "mod top;\n",
            "src/top/mod.rs": "mod x;\nmod y;\npub use y::helper;\n",
            "src/top/x.rs": "use super::*;\nfn f() { helper(); }\n",
            "src/top/y.rs": "pub fn helper() {}\n",
        })
        self.assertEqual(self.folder_edges(root), {("src/top", "x", "y")})

    def test_external_crates_and_std_are_not_followed(self):
        root = self.write({
            "src/lib.rs": "mod top;\n",
            "src/top/mod.rs": "mod x;\nmod y;\n",
            "src/top/x.rs": """
                use std::fmt;
                use http::Request;
                fn f() { fmt::Display; ::core::mem::swap; tokio::spawn; Request::new; }
                """,
            "src/top/y.rs": "mod fmt;\n",
            "src/top/y/fmt.rs": "pub struct Display;\n",
        })
        tree = arch.Tree(root)
        self.assertTrue(all(r.target is None for r in tree.references))

    def test_test_code_draws_no_arrow(self):
        root = self.write({
            "src/lib.rs": "mod top;\n",
            "src/top/mod.rs": "mod x;\nmod y;\n",
            "src/top/x.rs": """
                pub fn f() {}
                #[cfg(test)]
                mod tests { use super::super::y::G; }
                #[cfg(test)]
                fn helper() { crate::top::y::g() }
                #[cfg(test)]
                mod more;
                """,
            "src/top/x/more.rs": "use crate::top::y::G;\n",
            "src/top/y.rs": "use super::x::f;\nmod tests;\n#[path = \"y_tests.rs\"]\nmod t2;\n",
            "src/top/y/tests.rs": "use crate::top::x::f;\n",
            "src/top/y_tests.rs": "use crate::top::x::f;\n",
        })
        self.assertEqual(self.folder_edges(root), {("src/top", "y", "x")})
        files = {f.rel: f.lines for f in arch.Tree(root).files}
        self.assertEqual(files["src/top/x.rs"], 1)
        self.assertNotIn("src/top/x/more.rs", files)
        self.assertNotIn("src/top/y/tests.rs", files)
        self.assertNotIn("src/top/y_tests.rs", files)


class Rooms(Fixture):
    def test_the_binary_is_one_room_reaching_the_library_by_name(self):
        root = self.write({
            "src/lib.rs": "mod a;\nmod b;\npub use a::Thing;\n",
            "src/a.rs": "pub struct Thing;\npub fn f() { crate::b::g(); }\n",
            "src/b.rs": "pub fn g() { crate::a::f(); }\n",
            "src/main.rs": "mod cli;\nfn main() { demo::Thing; }\n",
            "src/cli.rs": "use demo::a::f;\nuse crate::main_helper;\n",
        })
        self.assertEqual(self.room_edges(root), {("a", "b"), ("b", "a"), ("main", "a")})
        report = arch.measure(root, root / "ARCHITECTURE.md")
        self.assertEqual([c["nodes"] for c in report["module_cycles"]], [["a", "b"]])
        self.assertIn("module cycle among a, b", report["breaches"])
        self.assertEqual(report["circles"], [], "the library's top level is rule 2's alone")

    def test_other_crates_have_circles_but_no_map(self):
        root = self.write({
            "src/lib.rs": "mod a;\n",
            "src/a.rs": "",
            "crates/other/Cargo.toml": '[package]\nname = "other-crate"\n',
            "crates/other/src/lib.rs": "mod p;\nmod q;\n",
            "crates/other/src/p.rs": "use crate::q::Q;\npub struct P;\n",
            "crates/other/src/q.rs": "use crate::p::P;\npub struct Q;\n",
            "crates/other/tests/t.rs": "",
            "ARCHITECTURE.md": "## Map\n\n```\na\n```\n",
        })
        report = arch.measure(root, root / "ARCHITECTURE.md")
        self.assertEqual(report["breaches"], ["circle in crates/other/src among p, q"])
        self.assertEqual(report["files"]["by_area"]["crates/other"]["count"], 3)


MAP_TREE = {
    "src/lib.rs": "mod server;\nmod api;\nmod config;\nmod body;\nmod error;\n",
    "src/server.rs": "use crate::api::A;\n",
    "src/api.rs": "pub struct A;\nuse crate::config::C;\nuse crate::body::B;\n",
    "src/config.rs": "pub struct C;\n",
    "src/body.rs": "pub struct B;\n",
    "src/error.rs": "pub struct E;\n",
    "src/main.rs": "fn main() { demo::server; }\n",
}


class Map(Fixture):
    def map_file(self, block: str) -> str:
        return f"# Architecture\n\nText.\n\n## Map\n\nRooms:\n\n```text\n{block}```\n\n## Later\n"

    def test_a_map_that_holds_passes(self):
        root = self.write({**MAP_TREE, "ARCHITECTURE.md": self.map_file(
            "main     the binary\nserver   connections\napi\nconfig, body  the config\n"
            "error\n")})
        code, out = self.run_main(root)
        self.assertEqual(code, 0, out)
        self.assertIn("api -> config: 1", out)
        self.assertIn("Breaches: 0", out)

    def test_arrows_up_and_within_a_level_missing_unknown_and_repeated_rooms(self):
        root = self.write({**MAP_TREE, "ARCHITECTURE.md": self.map_file(
            "main\nconfig  placed above api\napi, body\nserver\nghost\nmain\n")})
        code, out = self.run_main(root)
        self.assertEqual(code, 1)
        breaches = arch.measure(root, root / "ARCHITECTURE.md")["breaches"]
        self.assertEqual(
            breaches,
            [
                "map: `ghost` is not a top-level module of src/ (nor `main`)",
                "map: `main` appears more than once",
                "map: top-level module `error` is missing from the map",
                "map: api -> body joins two rooms of one level (1 references, e.g. "
                "src/api.rs:3 `crate::body::B`)",
                "map: api -> config points up the map (1 references, e.g. "
                "src/api.rs:2 `crate::config::C`)",
                "map: server -> api points up the map (1 references, e.g. "
                "src/server.rs:1 `crate::api::A`)",
            ],
        )

    def test_a_missing_map_is_a_breach(self):
        root = self.write({**MAP_TREE, "ARCHITECTURE.md": "# Architecture\n"})
        report = arch.measure(root, root / "ARCHITECTURE.md")
        self.assertEqual(report["breaches"], ["map: ARCHITECTURE.md has no `## Map` section"])


class Functions(unittest.TestCase):
    def lengths(self, text: str) -> dict[str, int]:
        code, _ = arch.remove_test_items(arch.strip_literals(textwrap.dedent(text)))
        return {f.name: f.length for f in arch.find_functions(code, "x.rs", "src")}

    def test_lengths_run_from_fn_to_closing_brace(self):
        lengths = self.lengths(
            """
            /// Doc comments
            /// are not counted,
            #[inline]
            #[allow(dead_code)]
            pub(crate) async fn documented(
                a: [u8; 3],
            ) -> Result<(), ()> {
                let s = "} not a brace";
                let c = '}';
                let f = |x: u8| {
                    x + 1
                };
                fn nested() {
                    println!("{}", 1);
                }
                Ok(())
            }
            trait T {
                fn declared(&self) -> [u8; 2];
                fn defaulted(&self) {}
            }
            extern "C" { fn external(); }
            #[cfg(test)]
            fn test_only() {
                }
            fn takes_fn_pointer(f: fn(u8) -> u8) -> u8 { f(1) }
            """
        )
        self.assertEqual(
            lengths,
            {"documented": 13, "nested": 3, "defaulted": 1, "takes_fn_pointer": 1},
        )

    def test_percentiles(self):
        self.assertEqual(arch.p90(list(range(1, 11))), 9)
        self.assertEqual(arch.p90(list(range(1, 12))), 10)
        self.assertEqual(arch.p90([5]), 5)
        self.assertEqual(arch.median([1, 2, 3, 10]), 2.5)


class Limits(Fixture):
    def test_long_functions_are_breaches(self):
        body = "    let x = 1;\n" * 59
        root = self.write({
            "src/lib.rs": "mod a;\n",
            "src/a.rs": f"pub fn long() {{\n{body}}}\npub fn short() {{\n{body[15:]}}}\n",
            "ARCHITECTURE.md": "## Map\n```\na\n```\n",
        })
        code, out = self.run_main(root)
        self.assertEqual(code, 1)
        self.assertIn("function src/a.rs:1 `long` is 61 lines > 60", out)
        self.assertNotIn("`short` is", out)
        self.assertIn("functions: p90 61 lines > 28", out)
        code, out = self.run_main(root, "--json")
        self.assertEqual(code, 1)
        self.assertEqual(json.loads(out)["functions"]["too_long"][0]["lines"], 61)

    def test_long_files_are_breaches(self):
        long_file = "".join(f"pub fn f{i}() {{\n    let a = {i};\n}}\n" for i in range(140))
        root = self.write({
            "src/lib.rs": "mod a;\nmod b;\n",
            "src/a.rs": long_file,
            "src/b.rs": long_file,
            "ARCHITECTURE.md": "## Map\n```\na\nb\n```\n",
        })
        code, out = self.run_main(root)
        self.assertEqual(code, 1)
        self.assertIn("files: median 420 lines > 150", out)
        self.assertIn("files: p90 420 lines > 400", out)
        self.assertNotIn("functions:", out.split("Breaches:")[1])


if __name__ == "__main__":
    unittest.main()
