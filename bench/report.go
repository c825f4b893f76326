package bench

import (
	"encoding/json"
	"fmt"
	"html"
	"io"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// Report is a self-contained HTML page of benchmark results: headings,
// text, tables and charts drawn as inline SVG. It references nothing
// outside itself (no scripts, fonts or styles fetched), so it opens offline
// and can be mailed or attached to an issue.
type Report struct {
	Title string
	// Meta lines under the title: the command line, the machine, the time.
	Meta     []string
	Sections []Section
	// Data, if set, is embedded as JSON (<script type="application/json"
	// id="data">), so the page also carries the figures for machines.
	Data any
}

// Section is a part of a report.
type Section struct {
	Heading string
	Text    []string // paragraphs
	Charts  []Chart
	Tables  []Table
}

// ChartKind selects how a chart is drawn.
type ChartKind int

const (
	// Bars draws one group of bars per category, one bar per series.
	Bars ChartKind = iota
	// Lines draws one line per series across the categories.
	Lines
)

// Scale is a chart's value axis.
type Scale int

const (
	// ScaleLinear draws the values from 0 on a linear axis (the default).
	ScaleLinear Scale = iota
	// ScaleLog draws them on a log axis with ticks at powers of ten.
	ScaleLog
	// ScaleAuto is ScaleLog when the positive values span more than two
	// decades (latency percentiles from p50 to max often do), else linear.
	ScaleAuto
)

// Chart is a chart of series over categories (block sizes, queue depths,
// percentiles, "ours"/"fio").
type Chart struct {
	Title      string
	Kind       ChartKind
	Scale      Scale
	XLabel     string
	YLabel     string
	Categories []string
	Series     []Series
}

// Series is one named set of values, one per category; NaN means no value.
type Series struct {
	Name   string
	Values []float64
}

// palette is colour-blind friendly (Okabe-Ito).
var palette = []string{"#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#F0E442", "#000000"}

// WriteReportFile writes r as HTML to a local path, atomically.
func WriteReportFile(path string, r *Report) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return fmt.Errorf("write report: %w", err)
	}
	defer os.Remove(tmp.Name())
	if err := r.WriteHTML(tmp); err != nil {
		tmp.Close()
		return fmt.Errorf("write report %s: %w", path, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("write report %s: %w", path, err)
	}
	if err := os.Chmod(tmp.Name(), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

const reportCSS = `body{font-family:system-ui,-apple-system,"Segoe UI",Helvetica,Arial,sans-serif;margin:2em auto;max-width:1000px;color:#222;padding:0 1em}
h1{font-size:1.6em;margin-bottom:.2em}h2{font-size:1.25em;margin-top:2em;border-bottom:1px solid #ddd;padding-bottom:.2em}
.meta{color:#666;font-size:.9em;margin:.1em 0;font-family:ui-monospace,monospace}
.tw{max-width:100%;overflow-x:auto}table{border-collapse:collapse;margin:1em 0;font-size:.9em}th,td{padding:.25em .7em;border-bottom:1px solid #e4e4e4;text-align:right;white-space:nowrap}
th{background:#f5f5f5;white-space:normal}td.t,th.t{text-align:left}td.t{white-space:normal;overflow-wrap:anywhere;min-width:8em}caption{text-align:left;font-weight:600;padding:.3em 0}
.notes{color:#555;font-size:.85em}figure{margin:1em 0}svg.chart{background:#fff;border:1px solid #eee;max-width:100%;height:auto}
svg.chart text{font-family:system-ui,Helvetica,Arial,sans-serif;fill:#333}`

// reportScript only inspects the page: it counts the charts that have a
// drawn area and marks (data-charts, data-errors) on <body>, so a headless
// browser can check that the page rendered. It fetches nothing.
const reportScript = `(function(){var errs=0;window.addEventListener('error',function(){errs++;document.body.setAttribute('data-errors',String(errs));});
window.addEventListener('load',function(){var n=0;document.querySelectorAll('svg.chart').forEach(function(s){var b=s.getBoundingClientRect();if(b.width>0&&b.height>0&&s.querySelectorAll('.mark').length>0){n++;}});
document.body.setAttribute('data-charts',String(n));document.body.setAttribute('data-errors',String(errs));});})();`

// WriteHTML renders the report.
func (r *Report) WriteHTML(w io.Writer) error {
	var b strings.Builder
	esc := html.EscapeString
	b.WriteString("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n")
	b.WriteString("<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:\">\n")
	fmt.Fprintf(&b, "<title>%s</title>\n<style>%s</style>\n<script>%s</script>\n</head><body>\n", esc(r.Title), reportCSS, reportScript)
	fmt.Fprintf(&b, "<h1>%s</h1>\n", esc(r.Title))
	for _, m := range r.Meta {
		fmt.Fprintf(&b, "<p class=\"meta\">%s</p>\n", esc(m))
	}
	chartID := 0
	for _, s := range r.Sections {
		if s.Heading != "" {
			fmt.Fprintf(&b, "<h2>%s</h2>\n", esc(s.Heading))
		}
		for _, p := range s.Text {
			fmt.Fprintf(&b, "<p>%s</p>\n", esc(p))
		}
		for _, c := range s.Charts {
			chartID++
			b.WriteString("<figure>\n")
			c.writeSVG(&b, chartID)
			b.WriteString("</figure>\n")
		}
		for _, t := range s.Tables {
			writeHTMLTable(&b, t)
		}
	}
	if r.Data != nil {
		// encoding/json escapes <, > and &, so the data cannot close the script.
		data, err := json.Marshal(r.Data)
		if err != nil {
			return fmt.Errorf("bench: report data: %w", err)
		}
		fmt.Fprintf(&b, "<script type=\"application/json\" id=\"data\">%s</script>\n", data)
	}
	fmt.Fprintf(&b, "<p class=\"meta\">generated by ffkit at %s</p>\n</body></html>\n", time.Now().UTC().Format(time.RFC3339))
	_, err := io.WriteString(w, b.String())
	return err
}

func writeHTMLTable(b *strings.Builder, t Table) {
	esc := html.EscapeString
	// Numbers stay on one line; text cells and headers wrap, and a table
	// wider than the page scrolls inside its own box.
	b.WriteString("<div class=\"tw\"><table>")
	if t.Title != "" {
		fmt.Fprintf(b, "<caption>%s</caption>", esc(t.Title))
	}
	cls := func(c string) string {
		if looksNumeric(c) || c == "-" {
			return ""
		}
		return ` class="t"`
	}
	if len(t.Header) > 0 {
		b.WriteString("<thead><tr>")
		for i, h := range t.Header {
			c := ""
			if len(t.Rows) > 0 && i < len(t.Rows[0]) {
				c = cls(t.Rows[0][i])
			}
			fmt.Fprintf(b, "<th%s>%s</th>", c, esc(h))
		}
		b.WriteString("</tr></thead>")
	}
	b.WriteString("<tbody>")
	for _, r := range t.Rows {
		b.WriteString("<tr>")
		for _, c := range r {
			fmt.Fprintf(b, "<td%s>%s</td>", cls(c), esc(c))
		}
		b.WriteString("</tr>")
	}
	b.WriteString("</tbody></table></div>\n")
	if len(t.Notes) > 0 {
		b.WriteString("<div class=\"notes\">")
		for _, n := range t.Notes {
			fmt.Fprintf(b, "<div>%s</div>", esc(n))
		}
		b.WriteString("</div>\n")
	}
}

// niceTicks returns about n round tick values from 0 to at least hi.
func niceTicks(hi float64, n int) []float64 {
	if hi <= 0 || math.IsNaN(hi) || math.IsInf(hi, 0) {
		hi = 1
	}
	raw := hi / float64(n)
	mag := math.Pow(10, math.Floor(math.Log10(raw)))
	step := mag
	for _, m := range []float64{1, 2, 2.5, 5, 10} {
		if m*mag >= raw {
			step = m * mag
			break
		}
	}
	var t []float64
	for v := 0.0; ; v += step {
		t = append(t, v)
		if v >= hi {
			break
		}
	}
	return t
}

func fmtTick(v float64) string {
	switch {
	case v == 0:
		return "0"
	case math.Abs(v) >= 1e6:
		return strconv.FormatFloat(v/1e6, 'f', -1, 64) + "M"
	case math.Abs(v) >= 1e4:
		return strconv.FormatFloat(v/1e3, 'f', -1, 64) + "k"
	}
	return strconv.FormatFloat(v, 'f', -1, 64)
}

func fmtValue(v float64) string {
	switch {
	case math.Abs(v) >= 100:
		return strconv.FormatFloat(v, 'f', 0, 64)
	case math.Abs(v) >= 1:
		return strconv.FormatFloat(v, 'f', 1, 64)
	}
	return strconv.FormatFloat(v, 'g', 3, 64)
}

// logRange reports whether the chart is drawn on a log axis and the
// decades it spans (10^lo .. 10^hi).
func (c *Chart) logRange() (lo, hi int, ok bool) {
	if c.Scale == ScaleLinear {
		return 0, 0, false
	}
	mn, mx := math.Inf(1), 0.0
	for _, s := range c.Series {
		for _, v := range s.Values {
			if v > 0 && !math.IsInf(v, 0) {
				mn, mx = min(mn, v), max(mx, v)
			}
		}
	}
	if mx == 0 || (c.Scale == ScaleAuto && mx/mn < 100) {
		return 0, 0, false
	}
	lo, hi = int(math.Floor(math.Log10(mn))), int(math.Ceil(math.Log10(mx)))
	if hi == lo {
		hi++
	}
	return lo, hi, true
}

func (c *Chart) writeSVG(b *strings.Builder, id int) {
	esc := html.EscapeString
	const W, H = 900, 380
	const left, right, top, bottom = 70, 20, 40, 80
	pw, ph := float64(W-left-right), float64(H-top-bottom)
	hi := 0.0
	for _, s := range c.Series {
		for _, v := range s.Values {
			if !math.IsNaN(v) && !math.IsInf(v, 0) {
				hi = max(hi, v)
			}
		}
	}
	ticks := niceTicks(hi, 5)
	top_ := ticks[len(ticks)-1]
	y := func(v float64) float64 { return float64(top) + ph - v/top_*ph }
	if lo, hi, ok := c.logRange(); ok {
		// Powers of ten from below the smallest value to above the largest.
		ticks = ticks[:0]
		for e := lo; e <= hi; e++ {
			ticks = append(ticks, math.Pow(10, float64(e)))
		}
		span := float64(hi - lo)
		y = func(v float64) float64 {
			if v <= 0 {
				v = ticks[0]
			}
			return float64(top) + ph - (math.Log10(v)-float64(lo))/span*ph
		}
	}
	fmt.Fprintf(b, "<svg class=\"chart\" id=\"chart%d\" xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" role=\"img\" aria-label=\"%s\">\n",
		id, W, H, W, H, esc(c.Title))
	fmt.Fprintf(b, "<text x=\"%d\" y=\"22\" font-size=\"15\" font-weight=\"600\">%s</text>\n", left, esc(c.Title))
	for _, t := range ticks {
		fmt.Fprintf(b, "<line x1=\"%d\" x2=\"%d\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"#e5e5e5\"/>", left, W-right, y(t), y(t))
		fmt.Fprintf(b, "<text x=\"%d\" y=\"%.1f\" font-size=\"11\" text-anchor=\"end\">%s</text>\n", left-6, y(t)+4, fmtTick(t))
	}
	fmt.Fprintf(b, "<line x1=\"%d\" x2=\"%d\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"#888\"/>\n", left, W-right, y(ticks[0]), y(ticks[0]))
	fmt.Fprintf(b, "<text transform=\"translate(16 %.1f) rotate(-90)\" font-size=\"12\" text-anchor=\"middle\">%s</text>\n", float64(top)+ph/2, esc(c.YLabel))
	fmt.Fprintf(b, "<text x=\"%.1f\" y=\"%d\" font-size=\"12\" text-anchor=\"middle\">%s</text>\n", float64(left)+pw/2, H-34, esc(c.XLabel))
	nc := max(1, len(c.Categories))
	slot := pw / float64(nc)
	for i, cat := range c.Categories {
		fmt.Fprintf(b, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"11\" text-anchor=\"middle\">%s</text>\n",
			float64(left)+slot*(float64(i)+0.5), float64(top)+ph+16, esc(cat))
	}
	ns := max(1, len(c.Series))
	switch c.Kind {
	case Lines:
		for si, s := range c.Series {
			col := palette[si%len(palette)]
			var pts []string
			for i, v := range s.Values {
				if i >= nc || math.IsNaN(v) || math.IsInf(v, 0) {
					continue
				}
				x := float64(left) + slot*(float64(i)+0.5)
				pts = append(pts, fmt.Sprintf("%.1f,%.1f", x, y(v)))
				fmt.Fprintf(b, "<circle class=\"mark\" cx=\"%.1f\" cy=\"%.1f\" r=\"3.5\" fill=\"%s\"><title>%s @ %s: %s</title></circle>\n",
					x, y(v), col, esc(s.Name), esc(c.Categories[i]), fmtValue(v))
			}
			if len(pts) > 1 {
				fmt.Fprintf(b, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"2\" points=\"%s\"/>\n", col, strings.Join(pts, " "))
			}
		}
	default:
		bw := slot * 0.8 / float64(ns)
		for si, s := range c.Series {
			col := palette[si%len(palette)]
			for i, v := range s.Values {
				if i >= nc || math.IsNaN(v) || math.IsInf(v, 0) {
					continue
				}
				x := float64(left) + slot*float64(i) + slot*0.1 + bw*float64(si)
				h := y(ticks[0]) - y(v)
				fmt.Fprintf(b, "<rect class=\"mark\" x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"%s\"><title>%s @ %s: %s</title></rect>\n",
					x, y(v), max(bw-1, 1), h, col, esc(s.Name), esc(c.Categories[i]), fmtValue(v))
				if bw >= 26 {
					fmt.Fprintf(b, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"10\" text-anchor=\"middle\">%s</text>\n", x+bw/2, y(v)-3, fmtValue(v))
				}
			}
		}
	}
	// Legend, under the x label.
	lx := float64(left)
	for si, s := range c.Series {
		col := palette[si%len(palette)]
		fmt.Fprintf(b, "<rect x=\"%.1f\" y=\"%d\" width=\"12\" height=\"12\" fill=\"%s\"/><text x=\"%.1f\" y=\"%d\" font-size=\"12\">%s</text>\n",
			lx, H-22, col, lx+16, H-12, esc(s.Name))
		lx += 16 + 7.5*float64(len([]rune(s.Name))) + 18
	}
	b.WriteString("</svg>\n")
}
