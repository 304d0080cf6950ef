module github.com/ferry/ferry/go

go 1.19
