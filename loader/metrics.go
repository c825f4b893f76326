package loader

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
)

// Collector exposes the loader's statistics as Prometheus metrics (named
// ffkit_loader_*, labelled with the rank), read from Stats at scrape time.
// Register it with a prometheus.Registry.
func (l *Loader) Collector() prometheus.Collector { return &collector{l: l} }

type collector struct{ l *Loader }

var loaderMetrics = []struct {
	name, help string
	counter    bool
	value      func(Stats) float64
}{
	{"ffkit_loader_batches_total", "Batches delivered to the consumer.", true, func(s Stats) float64 { return float64(s.Batches) }},
	{"ffkit_loader_samples_total", "Samples delivered to the consumer.", true, func(s Stats) float64 { return float64(s.Samples) }},
	{"ffkit_loader_bytes_total", "Sample bytes delivered to the consumer.", true, func(s Stats) float64 { return float64(s.Bytes) }},
	{"ffkit_loader_consumer_wait_seconds_total", "Time Next spent waiting for a batch.", true, func(s Stats) float64 { return s.ConsumerWait.Seconds() }},
	{"ffkit_loader_read_seconds_total", "Time batches spent in dataset reads (summed over batches in flight).", true, func(s Stats) float64 { return s.ReadTime.Seconds() }},
	{"ffkit_loader_transform_seconds_total", "Time batches spent in transforms.", true, func(s Stats) float64 { return s.TransformTime.Seconds() }},
	{"ffkit_loader_skipped_samples_total", "Bad samples skipped and substituted.", true, func(s Stats) float64 { return float64(s.Skipped) }},
	{"ffkit_loader_watchdog_reports_total", "Watchdog reports of a stalled batch.", true, func(s Stats) float64 { return float64(s.Stalls) }},
	{"ffkit_loader_memory_held_bytes", "Bytes of batch buffers held (prefetched or not yet released).", false, func(s Stats) float64 { return float64(s.MemoryHeld) }},
	{"ffkit_loader_memory_budget_bytes", "The memory budget.", false, func(s Stats) float64 { return float64(s.MemoryBudget) }},
	{"ffkit_loader_time_to_first_batch_seconds", "Time from Open to the first batch.", false, func(s Stats) float64 { return s.FirstBatch.Seconds() }},
}

func (c *collector) desc(i int) *prometheus.Desc {
	m := loaderMetrics[i]
	return prometheus.NewDesc(m.name, m.help, nil, prometheus.Labels{"rank": strconv.Itoa(c.l.opts.Rank)})
}

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for i := range loaderMetrics {
		ch <- c.desc(i)
	}
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	s := c.l.Stats()
	for i, m := range loaderMetrics {
		kind := prometheus.GaugeValue
		if m.counter {
			kind = prometheus.CounterValue
		}
		ch <- prometheus.MustNewConstMetric(c.desc(i), kind, m.value(s))
	}
}
