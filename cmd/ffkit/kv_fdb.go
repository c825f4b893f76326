//go:build fdb

package main

// With -tags fdb the FoundationDB backend is linked in, so `--kv fdb:FILE`
// works (it registers itself with kv.Open from init).
import _ "github.com/ffkit/ffkit/fs/kv/fdbkv"
