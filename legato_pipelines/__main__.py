from legato_pipelines.cli import main

main()
