from ijepa.benchmark import main

main()
