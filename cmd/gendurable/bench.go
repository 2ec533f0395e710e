package main

import (
	"context"
	"errors"
	"io"
)

func runBench(ctx context.Context, args []string, out io.Writer) error {
	return errors.New("not yet")
}
