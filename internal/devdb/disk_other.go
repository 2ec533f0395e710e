//go:build !linux

package devdb

import (
	"context"
	"errors"
	"io"
)

// Disk is a small filesystem of a throwaway cluster's own with a tablespace on it; only Linux
// has one (a tmpfs).
type Disk struct {
	// Tablespace is the tablespace's name; Dir is the mount point.
	Tablespace, Dir string
}

// AddDisk fails: a disk of the cluster's own is a tmpfs, which only Linux mounts.
func (d *DB) AddDisk(context.Context, string, int64) (*Disk, error) {
	return nil, errors.New("devdb: AddDisk: needs Linux (a tmpfs)")
}

// MoveWAL fails: a disk of the cluster's own is a tmpfs, which only Linux mounts.
func (d *DB) MoveWAL(context.Context, int64) (*Disk, error) {
	return nil, errors.New("devdb: MoveWAL: needs Linux (a tmpfs)")
}

// Fill fails: there is no disk.
func (k *Disk) Fill() (int64, error) { return 0, errors.New("devdb: Fill: needs Linux") }

// Free fails: there is no disk.
func (k *Disk) Free() error { return errors.New("devdb: Free: needs Linux") }

// Available fails: there is no disk.
func (k *Disk) Available() (int64, error) { return 0, errors.New("devdb: Available: needs Linux") }

func unmount([]string, io.Writer) error { return nil }
