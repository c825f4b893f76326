// Package docs holds ffkit's documentation. Its tests check that every
// relative link and #anchor in README.md and docs/**/*.md resolves, the way
// GitHub renders them, so a moved page or a renamed heading fails CI instead
// of leaving a dead link; and that every FFKIT_* environment variable the
// sources read is documented in docs/testing.md.
package docs

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"unicode"
)

// repoRoot is the repository, one level above this directory.
const repoRoot = ".."

// markdownFiles returns README.md and every .md file under docs/, as paths
// relative to the repository root, sorted.
func markdownFiles(t *testing.T, root string) []string {
	t.Helper()
	files := []string{"README.md"}
	err := filepath.WalkDir(filepath.Join(root, "docs"), func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && strings.HasSuffix(p, ".md") {
			rel, err := filepath.Rel(root, p)
			if err != nil {
				return err
			}
			files = append(files, rel)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(files)
	return files
}

// A link found in a Markdown file.
type link struct {
	line   int
	target string
}

var (
	// inlineLink matches [text](target) and ![alt](target), with an
	// optional title; the target has no spaces (none of ours do).
	inlineLink = regexp.MustCompile(`!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+"[^"]*")?\s*\)`)
	// refDef matches a reference definition: [name]: target
	refDef = regexp.MustCompile(`^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$`)
	// htmlAnchor matches explicit anchors: <a name="x"> or id="x".
	htmlAnchor = regexp.MustCompile(`<a\s[^>]*(?:name|id)="([^"]+)"`)
	heading    = regexp.MustCompile(`^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$`)
	codeSpan   = regexp.MustCompile("`+[^`]*`+")
)

// parsed is what the checker needs of one Markdown file.
type parsed struct {
	links   []link
	anchors map[string]bool
}

// parseMarkdown collects the links outside code and the anchors GitHub
// gives the headings (and explicit HTML anchors).
func parseMarkdown(src []byte) parsed {
	p := parsed{anchors: map[string]bool{}}
	seen := map[string]int{}
	var fence string // the open code fence ("```" or "~~~"), if any
	sc := bufio.NewScanner(bytes.NewReader(src))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		trimmed := strings.TrimSpace(line)
		if fence != "" {
			if strings.HasPrefix(trimmed, fence) {
				fence = ""
			}
			continue
		}
		if strings.HasPrefix(trimmed, "```") || strings.HasPrefix(trimmed, "~~~") {
			fence = trimmed[:3]
			continue
		}
		for _, m := range htmlAnchor.FindAllStringSubmatch(line, -1) {
			p.anchors[m[1]] = true
		}
		if m := heading.FindStringSubmatch(line); m != nil {
			a := githubAnchor(m[2])
			if k := seen[a]; k > 0 {
				p.anchors[fmt.Sprintf("%s-%d", a, k)] = true
			} else {
				p.anchors[a] = true
			}
			seen[a]++
		}
		if m := refDef.FindStringSubmatch(line); m != nil {
			p.links = append(p.links, link{n, m[1]})
			continue
		}
		code := codeSpan.ReplaceAllStringFunc(line, func(s string) string { return strings.Repeat(" ", len(s)) })
		for _, m := range inlineLink.FindAllStringSubmatch(code, -1) {
			p.links = append(p.links, link{n, m[1]})
		}
	}
	return p
}

var mdLink = regexp.MustCompile(`!?\[([^\]]*)\]\([^)]*\)`)

// githubAnchor is the id GitHub gives a heading: its text without
// Markdown, lower-cased, with every character that is not a letter,
// digit, space, hyphen or underscore dropped, and spaces made hyphens.
// (A repeated heading gets -1, -2, ... appended; parseMarkdown does that.)
func githubAnchor(text string) string {
	text = mdLink.ReplaceAllString(text, "$1")
	text = strings.NewReplacer("`", "", "*", "", "<", "", ">", "").Replace(text)
	var b strings.Builder
	for _, r := range strings.ToLower(text) {
		switch {
		case unicode.IsLetter(r), unicode.IsDigit(r), r == '-', r == '_':
			b.WriteRune(r)
		case r == ' ':
			b.WriteByte('-')
		}
	}
	return b.String()
}

// checkLinks returns one message per broken link of the files (paths
// relative to root).
func checkLinks(root string, files []string) ([]string, error) {
	cache := map[string]parsed{}
	load := func(rel string) (parsed, error) {
		if p, ok := cache[rel]; ok {
			return p, nil
		}
		src, err := os.ReadFile(filepath.Join(root, rel))
		if err != nil {
			return parsed{}, err
		}
		p := parseMarkdown(src)
		cache[rel] = p
		return p, nil
	}
	var broken []string
	for _, file := range files {
		p, err := load(file)
		if err != nil {
			return nil, err
		}
		for _, l := range p.links {
			if msg := checkLink(root, file, l.target, load); msg != "" {
				broken = append(broken, fmt.Sprintf("%s:%d: %s: %s", file, l.line, l.target, msg))
			}
		}
	}
	return broken, nil
}

var scheme = regexp.MustCompile(`^[a-zA-Z][a-zA-Z0-9+.-]*:`)

// checkLink says what is wrong with one link target of file, or "".
func checkLink(root, file, target string, load func(string) (parsed, error)) string {
	if scheme.MatchString(target) || strings.HasPrefix(target, "//") {
		return "" // http(s), mailto: not checked here
	}
	path, anchor, _ := strings.Cut(target, "#")
	if i := strings.IndexByte(path, '?'); i >= 0 {
		path = path[:i]
	}
	rel := file
	if path != "" {
		if strings.HasPrefix(path, "/") {
			return "absolute path (GitHub resolves it against the site, not the repository): use a relative one"
		}
		rel = filepath.Clean(filepath.Join(filepath.Dir(file), filepath.FromSlash(path)))
		if rel == ".." || strings.HasPrefix(rel, ".."+string(filepath.Separator)) {
			return "points outside the repository"
		}
		st, err := os.Stat(filepath.Join(root, rel))
		if err != nil {
			return "no such file or directory"
		}
		if anchor != "" && (st.IsDir() || !strings.HasSuffix(rel, ".md")) {
			return "anchor on a file that is not Markdown"
		}
	}
	if anchor == "" {
		return ""
	}
	p, err := load(rel)
	if err != nil {
		return err.Error()
	}
	if !p.anchors[anchor] {
		return fmt.Sprintf("no heading with anchor #%s in %s", anchor, rel)
	}
	return ""
}

// TestLinks checks every relative link and anchor of README.md and docs/.
func TestLinks(t *testing.T) {
	files := markdownFiles(t, repoRoot)
	if len(files) < 2 {
		t.Fatalf("found only %v: is the test running in docs/?", files)
	}
	broken, err := checkLinks(repoRoot, files)
	if err != nil {
		t.Fatal(err)
	}
	if len(broken) > 0 {
		t.Errorf("%d broken links in %d Markdown files:\n  %s", len(broken), len(files), strings.Join(broken, "\n  "))
	}
}

// TestGitHubAnchor pins the anchor rule on headings of the kinds ours use.
func TestGitHubAnchor(t *testing.T) {
	for _, c := range []struct{ heading, want string }{
		{"Two commands", "two-commands"},
		{"`ffkit load`: the training data loader", "ffkit-load-the-training-data-loader"},
		{"The metadata store (`fs/kv`): one contract, four backends", "the-metadata-store-fskv-one-contract-four-backends"},
		{"Exit codes", "exit-codes"},
		{"FFKIT_* knobs", "ffkit_-knobs"},
		{"Pack, verify & load", "pack-verify--load"},
		{"[Linked](x.md) heading", "linked-heading"},
	} {
		if got := githubAnchor(c.heading); got != c.want {
			t.Errorf("githubAnchor(%q) = %q, want %q", c.heading, got, c.want)
		}
	}
}

// TestCheckerFindsBrokenLinks runs the checker on a small tree with one link
// of each kind, good and bad, so a checker that passes everything fails here.
func TestCheckerFindsBrokenLinks(t *testing.T) {
	root := t.TempDir()
	write := func(rel, s string) {
		p := filepath.Join(root, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("README.md", "# Top\n\n## Usage\n\n[ok](docs/a.md#the-part) [ok](#usage) [bad](docs/missing.md)\n"+
		"[bad](#nope) [ok](docs/) `[not a link](nowhere.md)`\n\n```\n[in code](nowhere.md)\n```\n"+
		"[ok](https://example.com/x) [bad](../outside.md) [bad](docs/a.md#usage)\n")
	write("docs/a.md", "# A\n\n## The part\n\n## The part\n\n[ok](#the-part-1) [ok](../README.md#top) [bad](b.md)\n[ref]: ../README.md#gone\n")
	broken, err := checkLinks(root, []string{"README.md", "docs/a.md"})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"README.md:5: docs/missing.md: no such file or directory",
		"README.md:6: #nope: no heading with anchor #nope in README.md",
		"README.md:11: ../outside.md: points outside the repository",
		"README.md:11: docs/a.md#usage: no heading with anchor #usage in docs/a.md",
		"docs/a.md:7: b.md: no such file or directory",
		"docs/a.md:8: ../README.md#gone: no heading with anchor #gone in README.md",
	}
	if strings.Join(broken, "\n") != strings.Join(want, "\n") {
		t.Errorf("checker found:\n  %s\nwant:\n  %s", strings.Join(broken, "\n  "), strings.Join(want, "\n  "))
	}
}

// knobRef matches an FFKIT_* environment variable name.
var knobRef = regexp.MustCompile(`FFKIT_[A-Z0-9_]+`)

// TestKnobsDocumented checks that every FFKIT_* variable named in the Go,
// Python and shell sources has a row in docs/testing.md, so a new knob
// cannot go undocumented.
func TestKnobsDocumented(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join(repoRoot, "docs", "testing.md"))
	if err != nil {
		t.Fatal(err)
	}
	used := map[string][]string{}
	err = filepath.WalkDir(repoRoot, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() {
			if p != repoRoot && (strings.HasPrefix(name, ".") || name == "build" || name == "dist" || name == "_bin" || name == "__pycache__") {
				return filepath.SkipDir
			}
			return nil
		}
		switch filepath.Ext(name) {
		case ".go", ".py", ".sh":
		default:
			return nil
		}
		src, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		for _, k := range knobRef.FindAllString(string(src), -1) {
			used[k] = append(used[k], p)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(used) == 0 {
		t.Fatal("found no FFKIT_* variable in the sources: is the walk looking at the repository?")
	}
	var missing []string
	for k, files := range used {
		if !bytes.Contains(doc, []byte("`"+k+"`")) {
			missing = append(missing, fmt.Sprintf("%s (used in %s)", k, files[0]))
		}
	}
	sort.Strings(missing)
	if len(missing) > 0 {
		t.Errorf("docs/testing.md does not document %d FFKIT_* variables; add a row for each (what reads it, what it does):\n  %s",
			len(missing), strings.Join(missing, "\n  "))
	}
}
