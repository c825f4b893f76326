package bench

import (
	"bytes"
	"context"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

func sampleReport() *Report {
	return &Report{
		Title: "ffkit bench sweep <test>",
		Meta:  []string{"ffkit bench sweep /tmp/x --block-sizes 4K,1M"},
		Sections: []Section{{
			Heading: "Bandwidth",
			Text:    []string{"Reads with O_DIRECT & 2 runs per point."},
			Charts: []Chart{
				{Title: "MiB/s by block size", XLabel: "block size", YLabel: "MiB/s", Categories: []string{"4K", "64K", "1M"},
					Series: []Series{{Name: "qd1", Values: []float64{20, 300, 900}}, {Name: "qd16", Values: []float64{150, math.NaN(), 1800}}}},
				{Title: "latency", Kind: Lines, XLabel: "percentile", YLabel: "us", Categories: []string{"p50", "p90", "p99", "max"},
					Series: []Series{{Name: "ours", Values: []float64{80, 120, 400, 900}}, {Name: "fio", Values: []float64{70, 110, 300, 1000}}}},
			},
			Tables: []Table{{Title: "rows", Header: []string{"bs", "MiB/s"}, Rows: [][]string{{"4K", "20.0"}}, Notes: []string{"note"}}},
		}},
	}
}

func TestReportHTML(t *testing.T) {
	var b bytes.Buffer
	if err := sampleReport().WriteHTML(&b); err != nil {
		t.Fatal(err)
	}
	s := b.String()
	if n := strings.Count(s, `<svg class="chart"`); n != 2 {
		t.Errorf("%d charts in the page, want 2", n)
	}
	r := sampleReport()
	r.Data = map[string]string{"x": "</script><b>"}
	var b2 bytes.Buffer
	if err := r.WriteHTML(&b2); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(b2.String(), "</script><b>") || !strings.Contains(b2.String(), `id="data">{"x":"\u003c/script\u003e\u003cb\u003e"}</script>`) {
		t.Errorf("embedded data not escaped")
	}
	if strings.Contains(s, "<test>") || !strings.Contains(s, "&lt;test&gt;") {
		t.Error("title not escaped")
	}
	// Self-contained: nothing is loaded from anywhere.
	for _, bad := range []string{"src=", "href=", "@import", "url(", "http://", "https://"} {
		if strings.Contains(strings.ReplaceAll(s, `xmlns="http://www.w3.org/2000/svg"`, ""), bad) {
			t.Errorf("report references something external: %q", bad)
		}
	}
	// 5 bars (one NaN skipped) + 8 line points.
	if n := strings.Count(s, `class="mark"`); n != 13 {
		t.Errorf("%d marks, want 13", n)
	}
}

func findChromium() string {
	for _, n := range []string{"chromium", "chromium-browser", "google-chrome", "headless_shell"} {
		if p, err := exec.LookPath(n); err == nil {
			return p
		}
	}
	return ""
}

// TestReportRendersInChromium opens a report in headless Chromium and
// checks, from the rendered DOM, that every chart was laid out with its
// marks and that no script error happened.
func TestReportRendersInChromium(t *testing.T) {
	chrome := findChromium()
	if chrome == "" {
		t.Skip("chromium is not installed (scripts/setup.sh installs it): skipping the headless rendering check")
	}
	dir := t.TempDir()
	page := filepath.Join(dir, "report.html")
	if err := WriteReportFile(page, sampleReport()); err != nil {
		t.Fatal(err)
	}
	dom, logs := renderInChromium(t, chrome, page)
	if !regexp.MustCompile(`data-charts="2"`).MatchString(dom) {
		t.Errorf("rendered page does not show its 2 charts; body: %.300s\nchromium log:\n%s", bodyTag(dom), logs)
	}
	if !strings.Contains(dom, `data-errors="0"`) {
		t.Errorf("script errors on the page; body: %.300s", bodyTag(dom))
	}
	if strings.Contains(logs, "Uncaught") || strings.Contains(logs, "Refused to") {
		t.Errorf("chromium reported errors:\n%s", logs)
	}
}

func bodyTag(dom string) string {
	if i := strings.Index(dom, "<body"); i >= 0 {
		return dom[i:]
	}
	return dom
}

// renderInChromium loads a local page in a fresh headless Chromium and
// returns the DOM after scripts ran, and Chromium's console log.
func renderInChromium(t *testing.T, chrome, page string) (dom, logs string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	profile := t.TempDir()
	cmd := exec.CommandContext(ctx, chrome, "--headless", "--no-sandbox", "--disable-gpu",
		"--disable-background-networking", "--disable-component-update", "--disable-sync",
		"--no-first-run", "--disable-dev-shm-usage", "--user-data-dir="+profile,
		"--enable-logging=stderr", "--v=0", "--virtual-time-budget=3000", "--dump-dom", "file://"+page)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	cmd.Env = append(os.Environ(), "HOME="+profile)
	if err := cmd.Run(); err != nil {
		t.Fatalf("chromium: %v\n%s", err, errb.String())
	}
	return out.String(), errb.String()
}

// Latency percentiles spanning decades are drawn on a log axis (ticks at
// powers of ten) and tables are wrapped so they fit the page (issue 14).
func TestReportLogScaleAndTableFit(t *testing.T) {
	lat := Chart{Title: "lat", Kind: Lines, Scale: ScaleAuto, Categories: []string{"p50", "p99", "max"},
		Series: []Series{{Name: "a", Values: []float64{40, 900, 250000}}}}
	lin := Chart{Title: "bw", Scale: ScaleAuto, Categories: []string{"x", "y"},
		Series: []Series{{Name: "a", Values: []float64{400, 900}}}}
	tab := Table{Header: []string{"reader", "samples/s"}, Rows: [][]string{{"a very long reader name that must wrap inside its column", "123"}}}
	var b strings.Builder
	if err := (&Report{Title: "t", Sections: []Section{{Charts: []Chart{lat, lin}, Tables: []Table{tab}}}}).WriteHTML(&b); err != nil {
		t.Fatal(err)
	}
	page := b.String()
	charts := strings.SplitAfter(page, "</svg>")
	for _, tick := range []string{">10<", ">100<", ">1000<", ">1M<"} {
		if !strings.Contains(charts[0], tick) {
			t.Errorf("latency chart lacks the log tick %s", tick)
		}
	}
	if strings.Contains(charts[1], ">100<") || !strings.Contains(charts[1], ">0<") {
		t.Errorf("a chart within one decade should stay linear from 0")
	}
	if !strings.Contains(page, `<div class="tw"><table>`) || !strings.Contains(page, "td.t{white-space:normal") {
		t.Error("tables are not wrapped to fit their column")
	}
}
