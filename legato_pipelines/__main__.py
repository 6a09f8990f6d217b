from legato_pipelines.entry import main

main()
