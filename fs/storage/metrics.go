package storage

import (
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

type metrics struct {
	reg          *prometheus.Registry
	requests     *prometheus.CounterVec
	errors       *prometheus.CounterVec
	latency      *prometheus.HistogramVec
	bytesIn      prometheus.Counter
	bytesOut     prometheus.Counter
	corrupt      prometheus.Counter
	resyncChunks prometheus.Counter
}

func newMetrics(s *Service) *metrics {
	m := &metrics{reg: prometheus.NewRegistry()}
	m.requests = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ffkit_storage_requests_total", Help: "Requests served, by method."}, []string{"method"})
	m.errors = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ffkit_storage_errors_total", Help: "Requests failed, by method."}, []string{"method"})
	m.latency = prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "ffkit_storage_request_seconds", Help: "Request latency, by method.",
		Buckets: prometheus.ExponentialBuckets(50e-6, 4, 10)}, []string{"method"})
	m.bytesIn = prometheus.NewCounter(prometheus.CounterOpts{Name: "ffkit_storage_received_bytes_total", Help: "Request payload bytes received."})
	m.bytesOut = prometheus.NewCounter(prometheus.CounterOpts{Name: "ffkit_storage_sent_bytes_total", Help: "Reply payload bytes sent."})
	m.corrupt = prometheus.NewCounter(prometheus.CounterOpts{Name: "ffkit_storage_corrupt_chunks_total", Help: "Chunk checksum failures found by reads."})
	m.resyncChunks = prometheus.NewCounter(prometheus.CounterOpts{Name: "ffkit_storage_resync_chunks_total", Help: "Chunks sent to syncing successors."})
	used := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "ffkit_storage_used_bytes", Help: "Committed chunk bytes on all targets."}, func() float64 {
		var n int64
		for _, ts := range s.targets {
			n += ts.Used()
		}
		return float64(n)
	})
	m.reg.MustRegister(m.requests, m.errors, m.latency, m.bytesIn, m.bytesOut, m.corrupt, m.resyncChunks, used,
		prometheus.NewGoCollector(), prometheus.NewProcessCollector(prometheus.ProcessCollectorOpts{}))
	return m
}

var methodNames = map[uint16]string{16: "write", 17: "update", 18: "batch_read", 19: "sync_start", 20: "sync_done", 21: "list", 22: "remove"}

func (m *metrics) observe(method uint16, start time.Time, in int, out [][]byte, err error) {
	name := methodNames[method]
	if name == "" {
		name = strconv.Itoa(int(method))
	}
	m.requests.WithLabelValues(name).Inc()
	if err != nil {
		m.errors.WithLabelValues(name).Inc()
	}
	m.latency.WithLabelValues(name).Observe(time.Since(start).Seconds())
	m.bytesIn.Add(float64(in))
	n := 0
	for _, b := range out {
		n += len(b)
	}
	m.bytesOut.Add(float64(n))
}
