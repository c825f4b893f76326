package main

import (
	"testing"

	"github.com/ffkit/ffkit/fs"
)

func TestModeString(t *testing.T) {
	for _, c := range []struct {
		fi   fs.FileInfo
		want string
	}{
		{fs.FileInfo{}, "-rw-r--r--"},
		{fs.FileInfo{IsDir: true}, "drwxr-xr-x"},
		{fs.FileInfo{HasOwner: true, Perm: 0o750}, "-rwxr-x---"},
		{fs.FileInfo{IsDir: true, HasOwner: true, Perm: 0o1777}, "drwxrwxrwt"},
		{fs.FileInfo{IsDir: true, HasOwner: true, Perm: 0o2750}, "drwxr-s---"},
		{fs.FileInfo{HasOwner: true, Perm: 0o4644}, "-rwSr--r--"},
		{fs.FileInfo{Kind: fs.KindSymlink, HasOwner: true, Perm: 0o777}, "lrwxrwxrwx"},
		{fs.FileInfo{Kind: fs.KindFIFO, HasOwner: true, Perm: 0o600}, "prw-------"},
		{fs.FileInfo{Kind: fs.KindBlock, HasOwner: true, Perm: 0o660}, "brw-rw----"},
	} {
		if got := modeString(c.fi); got != c.want {
			t.Errorf("modeString(%+v) = %s, want %s", c.fi, got, c.want)
		}
	}
}
