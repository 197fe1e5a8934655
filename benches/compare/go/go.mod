module fibracompare

go 1.19
